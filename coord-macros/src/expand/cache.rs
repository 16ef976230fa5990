//! The `#[cached]` layer: its spec, and its step, inside idempotency and outside
//! single-flight.

use proc_macro2::{Literal, TokenStream};
use quote::{quote, quote_spanned};

use super::function::ReturnSite;
use super::spans::respan;
use super::spec_values::millis;
use crate::model::CacheLayer;
use crate::options::Scope;

/// The `cache` field of the `OpSpec`: an `Option<CacheSpec>`, with the slot of its local tier.
pub(super) fn spec(layer: Option<&CacheLayer>, krate: &TokenStream) -> TokenStream {
    let Some(layer) = layer else {
        return quote!(::core::option::Option::None);
    };
    let ttl = millis(krate, layer.ttl_ms);
    let local_ttl = millis(krate, layer.local_ttl_ms);
    let scope = match layer.scope {
        Scope::Local => quote!(#krate::__private::CacheScope::Local),
        Scope::Shared => quote!(#krate::__private::CacheScope::Shared),
        Scope::TwoTier => quote!(#krate::__private::CacheScope::TwoTier),
    };
    let max_capacity = Literal::u64_suffixed(layer.max_capacity);
    let cache_err = layer.cache_err;
    quote! {
        ::core::option::Option::Some(#krate::__private::CacheSpec {
            ttl: #ttl,
            scope: #scope,
            local_ttl: #local_ttl,
            max_capacity: #max_capacity,
            cache_err: #cache_err,
            local: #krate::__private::LocalSlot::new(),
        })
    }
}

/// The runtime function that picks the cache's form. The form checks the output's bounds for
/// the scope: clones in memory for `local`, serde for the shared tier (the whole `Result`
/// with `cache_err`).
fn form(layer: Option<&CacheLayer>) -> TokenStream {
    match layer.map(|layer| (layer.scope, layer.cache_err)) {
        None | Some((Scope::Local, _)) => quote!(local_form),
        Some((_, false)) => quote!(shared_form),
        Some((_, true)) => quote!(shared_result_form),
    }
}

/// The layer's step around `inner`.
pub(super) fn wrap(
    layer: Option<&CacheLayer>,
    site: &ReturnSite,
    inner: TokenStream,
) -> TokenStream {
    let ReturnSite {
        at, krate, call, ..
    } = site;
    let form = respan(form(layer), *at);
    quote_spanned! {*at=>
        #krate::__private::cached(#call, #krate::__private::#form(), #inner)
    }
}
