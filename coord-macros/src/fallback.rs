//! What the macros emit when they reject their input: the errors, and the function as the
//! user wrote it. Keeping the function means the rest of the crate still resolves it, so the
//! user sees the attribute's errors and nothing caused by a missing item.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote};
use syn::ItemFn;

use crate::errors::Errors;
use crate::options::Kind;

/// The errors, then the function as the user wrote it (our attributes already removed), so
/// that callers and an editor's completion in the body keep resolving it.
pub(crate) fn with_errors(errors: syn::Error, func: TokenStream) -> TokenStream {
    let errors = errors.to_compile_error();
    quote! {
        #errors
        #func
    }
}

/// The attribute was put on something that is not a function with a body. `found` holds the
/// errors in the attributes' arguments, reported too.
pub(crate) fn not_a_function(kind: Kind, found: Errors, item: TokenStream) -> TokenStream {
    let message = format!(
        "#[{}] goes on an `async fn` with a body (a free function, or a method in an `impl` block)",
        kind.name()
    );
    let error = found
        .then(syn::Error::new(Span::call_site(), message))
        .to_compile_error();
    quote! {
        #error
        #item
    }
}

/// The function already carries an expansion of our attributes. It is passed through as is.
pub(crate) fn expanded_twice(kind: Kind, func: &ItemFn) -> TokenStream {
    let message = format!(
        "this #[{0}] was not taken in by the coord attribute above it, which already \
         expanded this function: coord attributes are recognised by name, so do not import \
         them under another one; write `#[{0}]` or `#[coord_core::{0}]`",
        kind.name()
    );
    let error = syn::Error::new(Span::call_site(), message).to_compile_error();
    let func = func.to_token_stream();
    quote! {
        #error
        #func
    }
}
