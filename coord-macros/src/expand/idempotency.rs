//! The `#[idempotent]` layer: its spec, the fingerprint of the parameters it checks a reused
//! key against, and its step, the outermost.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::Ident;

use super::call::borrow_path;
use super::function::{Locals, ReturnSite};
use super::spans::{respan, with_span};
use super::spec_values::{lease_policy, millis, policy, replica_acks, written};
use crate::model::{IdempotencyLayer, TransactionParam};
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
    let replica_acks = replica_acks(krate, layer.replica_acks);
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
            replica_acks: #replica_acks,
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
pub(super) fn wrap(
    layer: Option<&IdempotencyLayer>,
    site: &ReturnSite,
    inner: TokenStream,
) -> TokenStream {
    if let Some(param) = layer.and_then(|layer| layer.transaction.as_ref()) {
        return wrap_in_transaction(param, site, inner);
    }
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

/// The step of `transaction = "tx"`: claim; on a replay or refusal, answer without the body;
/// else run `inner` with `tx` lent to it (a reborrow under the same name, which ends with the
/// body), then write the outcome in `tx` itself. `tx` is coerced to the transaction trait
/// object at its own type, so a type coord cannot write in is reported on the parameter.
fn wrap_in_transaction(
    param: &TransactionParam,
    site: &ReturnSite,
    inner: TokenStream,
) -> TokenStream {
    let ReturnSite {
        at,
        krate,
        call,
        fingerprint,
        ..
    } = site;
    let tx = &param.ident;
    let mutable = param.mutable.then(|| quote!(mut));
    let as_transaction = {
        let krate_at = respan(krate.clone(), param.ty_span);
        let object = with_span(&Ident::new("__coord_tx", Span::call_site()), *at);
        // A parameter declared `mut` is borrowed as such (a `&mut &mut T` is a transaction
        // too), so its `mut` is used and does not warn: the body's assignments go to the
        // rebinding.
        let source = if param.mutable {
            quote_spanned!(param.ty_span=> &mut #tx)
        } else {
            quote_spanned!(param.ty_span=> #tx)
        };
        quote_spanned! {param.ty_span=>
            let #object: &mut dyn #krate_at::provider::OutcomeTransaction = #source;
        }
    };
    let object = with_span(&Ident::new("__coord_tx", Span::call_site()), *at);
    quote_spanned! {*at=>
        async {
            match #krate::__private::claim_in_transaction(#call, #fingerprint).await {
                #krate::__private::TransactionalStep::Answer(__coord_answer) => __coord_answer,
                #krate::__private::TransactionalStep::Run(mut __coord_run) => {
                    let __coord_output = __coord_run.body(#call, {
                        #[allow(unused_variables, unused_mut)]
                        let #mutable #tx = &mut *#tx;
                        #inner
                    }).await;
                    #as_transaction
                    __coord_run.complete_in(#call, #object, __coord_output).await
                }
            }
        }
    }
}
