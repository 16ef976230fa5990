//! The `#[single_flight]` layer: its step, in this process, or across the cluster with a
//! leader's lease. It has no spec in the `OpSpec`; the cluster step carries its own.

use proc_macro2::TokenStream;
use quote::quote_spanned;

use super::function::ReturnSite;
use super::spans::respan;
use super::spec_values::{millis, replica_acks};
use crate::model::ClusterFlightLayer;

/// The layer's step around `inner`: the process flight, or the cluster one with
/// `scope = "cluster"`.
pub(super) fn wrap(
    cluster: Option<&ClusterFlightLayer>,
    site: &ReturnSite,
    inner: TokenStream,
) -> TokenStream {
    match cluster {
        None => {
            let ReturnSite {
                at, krate, call, ..
            } = site;
            quote_spanned! {*at=>
                #krate::__private::single_flight(#call, #inner)
            }
        }
        Some(layer) => cluster_flight(layer, site, inner),
    }
}

/// The cluster-scope single-flight call. Its bound (`ClusterOutput`) checks the output at the
/// return type. Whether errors are handed over is picked here, where the output type is
/// concrete: the probe resolves to the shared form when the error type is serialisable, and
/// to the opaque one (followers get `LeaderFailed`) otherwise.
fn cluster_flight(
    layer: &ClusterFlightLayer,
    site: &ReturnSite,
    inner: TokenStream,
) -> TokenStream {
    let ReturnSite {
        at,
        typed,
        krate,
        call,
        ..
    } = site;
    let at = *at;
    let lease = respan(millis(krate, layer.lease_ms), at);
    let replica_acks = respan(replica_acks(krate, layer.replica_acks), at);
    let errors = match typed {
        Some(ret) => quote_spanned! {at=>
            {
                #[allow(unused_imports)]
                use #krate::__private::{OpaqueErrorProbe as _, SharedErrorProbe as _};
                (&&#krate::__private::FlightProbe::<#ret>::new()).error_form()
            }
        },
        None => quote_spanned!(at=> #krate::__private::opaque_errors()),
    };
    quote_spanned! {at=>
        #krate::__private::cluster_single_flight(
            #call,
            #krate::__private::ClusterFlightSpec {
                lease: #lease,
                replica_acks: #replica_acks,
            },
            #errors,
            #inner,
        )
    }
}
