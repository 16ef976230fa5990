//! Option values written as the const expressions the runtime's spec structs hold: durations,
//! backend-error policies, lease policies and the `Written` flags.

use proc_macro2::{Literal, Span, TokenStream};
use quote::quote;
use syn::Ident;

use crate::model::{LeasePolicy, ReplicaAcksChoice};
use crate::options::{Lost, Policy};

/// `Duration::from_millis(ms)`.
pub(super) fn millis(krate: &TokenStream, ms: u64) -> TokenStream {
    let ms = Literal::u64_suffixed(ms);
    quote!(#krate::__private::Duration::from_millis(#ms))
}

/// The `Written` set of a spec: which options the attribute gave rather than defaulted.
pub(super) fn written(krate: &TokenStream, flags: &[&str]) -> TokenStream {
    let flags = flags.iter().map(|flag| Ident::new(flag, Span::call_site()));
    quote!(#krate::__private::Written::NONE #(.with(#krate::__private::Written::#flags))*)
}

/// The `renew` and `on_lost` fields of a spec.
pub(super) fn lease_policy(krate: &TokenStream, lease: &LeasePolicy) -> (TokenStream, TokenStream) {
    let renew = match lease.renew_ms {
        None => quote!(::core::option::Option::None),
        Some(ms) => {
            let every = millis(krate, ms);
            quote!(::core::option::Option::Some(#every))
        }
    };
    let on_lost = match lease.on_lost {
        None => quote!(::core::option::Option::None),
        Some(Lost::Cancel) => {
            quote!(::core::option::Option::Some(#krate::__private::OnLost::Cancel))
        }
        Some(Lost::Signal) => {
            quote!(::core::option::Option::Some(#krate::__private::OnLost::Signal))
        }
    };
    (renew, on_lost)
}

/// The `on_backend_error` field of a spec; `None` leaves it to the coordinator's policy.
pub(super) fn policy(krate: &TokenStream, policy: Option<Policy>) -> TokenStream {
    match policy {
        None => quote!(::core::option::Option::None),
        Some(Policy::FailClosed) => {
            quote!(::core::option::Option::Some(#krate::__private::OnBackendError::FailClosed))
        }
        Some(Policy::FailOpen) => {
            quote!(::core::option::Option::Some(#krate::__private::OnBackendError::FailOpen))
        }
    }
}

/// The `replica_acks` field of a spec: `None` leaves the provider's setting.
pub(super) fn replica_acks(krate: &TokenStream, acks: Option<ReplicaAcksChoice>) -> TokenStream {
    match acks {
        None => quote!(::core::option::Option::None),
        Some(ReplicaAcksChoice::Off) => {
            quote!(::core::option::Option::Some(#krate::__private::ReplicaAcks::Off))
        }
        Some(ReplicaAcksChoice::Wait {
            replicas,
            timeout_ms,
        }) => {
            let replicas = Literal::u32_suffixed(replicas);
            let timeout = millis(krate, timeout_ms);
            quote!(::core::option::Option::Some(#krate::__private::ReplicaAcks::Wait {
                replicas: #replicas,
                timeout: #timeout,
            }))
        }
    }
}
