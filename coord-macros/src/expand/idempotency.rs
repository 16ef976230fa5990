//! The `#[idempotent]` layer: its spec, the fingerprint of the parameters it checks a reused
//! key against, and its step, the outermost.

use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};

use super::call::borrow_path;
use super::function::{Locals, ReturnSite};
use super::spec_values::{lease_policy, millis, policy, written};
use crate::model::IdempotencyLayer;
use crate::options::{Abandoned, MissingKey, StoreError};

/// The `idempotency` field of the `OpSpec`: an `Option<IdempotencySpec>`.
pub(super) fn spec(layer: Option<&IdempotencyLayer>, krate: &TokenStream) -> TokenStream {
    let Some(layer) = layer else {
        return quote!(::core::option::Option::None);
    };
    let retention = millis(krate, layer.retention_ms);
    let in_flight_lease = millis(krate, layer.in_flight_lease_ms);
    let wait = millis(krate, layer.wait_ms);
    let on_backend_error = policy(krate, layer.on_backend_error);
    let (renew, on_lost) = lease_policy(krate, &layer.lease_policy);
    let on_abandoned = match layer.on_abandoned {
        Abandoned::Rerun => quote!(#krate::__private::OnAbandoned::Rerun),
        Abandoned::Fail => quote!(#krate::__private::OnAbandoned::Fail),
    };
    let on_store_error = match layer.on_store_error {
        StoreError::Error => quote!(#krate::__private::OnStoreError::Error),
        StoreError::ReturnOk => quote!(#krate::__private::OnStoreError::ReturnOk),
    };
    let written = written(krate, &layer.written);
    let on_missing_key = match layer.on_missing_key {
        MissingKey::Fail => quote!(#krate::__private::OnMissingKey::Fail),
        MissingKey::RunUnprotected => {
            quote!(#krate::__private::OnMissingKey::RunUnprotected)
        }
    };
    quote! {
        ::core::option::Option::Some(#krate::__private::IdempotencySpec {
            retention: #retention,
            in_flight_lease: #in_flight_lease,
            wait: #wait,
            on_backend_error: #on_backend_error,
            renew: #renew,
            on_lost: #on_lost,
            on_abandoned: #on_abandoned,
            on_store_error: #on_store_error,
            on_missing_key: #on_missing_key,
            written: #written,
        })
    }
}

/// The statement binding [`Locals::fingerprint`]: a hash of the `fingerprint` parameters, or
/// `None` without them. Rendered before the body takes ownership of the parameters.
pub(super) fn fingerprint(
    layer: &IdempotencyLayer,
    krate: &TokenStream,
    locals: &Locals,
) -> TokenStream {
    let fingerprint = &locals.fingerprint;
    if layer.fingerprint.is_empty() {
        return quote!(let #fingerprint = ::core::option::Option::None;);
    }
    let adds = layer.fingerprint.iter().map(|path| {
        let value = borrow_path(path);
        quote_spanned!(path.span=> .param(#value))
    });
    quote! {
        let #fingerprint = ::core::option::Option::Some(
            #krate::__private::FingerprintHasher::new() #(#adds)* .finish()
        );
    }
}

/// The layer's step around `inner`.
pub(super) fn wrap(site: &ReturnSite, inner: TokenStream) -> TokenStream {
    let ReturnSite {
        at,
        krate,
        call,
        fingerprint,
        ..
    } = site;
    quote_spanned! {*at=>
        #krate::__private::idempotent(#call, #fingerprint, #inner)
    }
}
