//! The `#[distributed_lock(key_from_each = "..")]` step: a multi-key lock of one key per
//! element of the named collection, right around the body.

use proc_macro2::{Span, TokenStream};
use quote::quote_spanned;
use syn::LitStr;

use super::call::borrow_path;
use super::function::ReturnSite;
use crate::value::KeyPath;

/// The multi-key lock's step around `inner`. The keys are built from a borrow of the
/// collection before `inner` (which moves the parameters into the body) is evaluated. The
/// `EachKeyPart` bound of `each_key` is what rejects a parameter that is not a collection of
/// key parts; its error is placed at the name the user wrote.
pub(super) fn wrap(each: &KeyPath, site: &ReturnSite, inner: TokenStream) -> TokenStream {
    let ReturnSite {
        at, krate, call, ..
    } = site;
    let collection = borrow_path(each);
    let name = LitStr::new(&each.text(), Span::call_site());
    let keys = quote_spanned! {each.span=>
        #krate::__private::each_key(#call, #collection, #name)
    };
    quote_spanned! {*at=>
        #krate::__private::distributed_multi_lock(#call, #keys, #inner)
    }
}
