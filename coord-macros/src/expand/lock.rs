//! The `#[distributed_lock]` layer: its spec, and its step, the innermost, right around the
//! body.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};

use super::function::ReturnSite;
use super::spec_values::{lease_policy, millis, policy, replica_acks, written};
use crate::model::LockLayer;
use crate::options::RwChoice;

/// The `lock` field of the `OpSpec`: an `Option<LockSpec>`.
pub(super) fn spec(layer: Option<&LockLayer>, krate: &TokenStream) -> TokenStream {
    let Some(layer) = layer else {
        return quote!(::core::option::Option::None);
    };
    let lease = millis(krate, layer.lease_ms);
    let wait = millis(krate, layer.wait_ms);
    let fenced = layer.fenced;
    let permits = proc_macro2::Literal::u32_suffixed(layer.permits);
    let rw = match layer.rw {
        None => quote!(::core::option::Option::None),
        Some(RwChoice::Read) => {
            quote!(::core::option::Option::Some(#krate::__private::RwMode::Read))
        }
        Some(RwChoice::Write) => {
            quote!(::core::option::Option::Some(#krate::__private::RwMode::Write))
        }
    };
    let written = written(krate, &layer.written);
    let replica_acks = replica_acks(krate, layer.replica_acks);
    let on_backend_error = policy(krate, layer.on_backend_error);
    let (renew, on_lost) = lease_policy(krate, &layer.lease_policy);
    quote! {
        ::core::option::Option::Some(#krate::__private::LockSpec {
            lease: #lease,
            wait: #wait,
            fenced: #fenced,
            permits: #permits,
            rw: #rw,
            on_backend_error: #on_backend_error,
            renew: #renew,
            on_lost: #on_lost,
            replica_acks: #replica_acks,
            written: #written,
        })
    }
}

/// The layer's step around `inner`: with `key_from_each`, a multi-key lock.
pub(super) fn wrap(
    layer: Option<&LockLayer>,
    site: &ReturnSite,
    inner: TokenStream,
) -> TokenStream {
    if let Some(each) = layer.and_then(|layer| layer.each.as_ref()) {
        return super::multi_lock::wrap(each, site, inner);
    }
    let ReturnSite {
        at, krate, call, ..
    } = site;
    quote_spanned! {*at=>
        #krate::__private::distributed_lock(#call, #inner)
    }
}
