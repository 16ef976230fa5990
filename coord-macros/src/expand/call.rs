//! The call every layer shares: the operation's static spec, the coordinator, and the key,
//! built once before the body takes ownership of the parameters.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Expr, Ident, LitStr, Signature};

use super::function::Locals;
use super::spans::respan;
use crate::model::Stack;
use crate::value::KeyPath;

/// The layers' parts of the operation's `OpSpec`, each an `Option` of its spec.
pub(super) struct LayerSpecs {
    pub(super) idempotency: TokenStream,
    pub(super) cache: TokenStream,
    pub(super) lock: TokenStream,
}

/// The `OpSpec` the function's static holds: the operation's name, the layers' specs, its
/// telemetry, whether the key is recorded and the profile.
pub(super) fn op_spec(
    stack: &Stack,
    sig: &Signature,
    krate: &TokenStream,
    layers: LayerSpecs,
) -> TokenStream {
    let name = match &stack.name {
        Some(name) => LitStr::new(name, Span::call_site()).to_token_stream(),
        None => {
            let fn_name = sig.ident.unraw().to_string();
            quote!(::core::concat!(::core::module_path!(), "::", #fn_name))
        }
    };
    let record_key = stack.record_key;
    let profile = match &stack.profile {
        None => quote!(::core::option::Option::None),
        Some(name) => {
            let name = LitStr::new(name, Span::call_site());
            quote!(::core::option::Option::Some(#name))
        }
    };
    let LayerSpecs {
        idempotency,
        cache,
        lock,
    } = layers;
    quote! {
        #krate::__private::OpSpec {
            name: #name,
            idempotency: #idempotency,
            cache: #cache,
            lock: #lock,
            telemetry: #krate::__private::OpTelemetry::new(),
            key_prefix: #krate::__private::KeyPrefixCache::new(),
            record_key: #record_key,
            profile: #profile,
        }
    }
}

/// The statements binding [`Locals::coordinator`]: the installed coordinator, or the
/// `coordinator = <expr>` given, evaluated on every call and reported at the expression when
/// it is not a coordinator.
///
/// A field of a `&self` receiver (`coordinator = self.coord`) is borrowed rather than cloned:
/// it outlives the call whatever the body does with `self` (a shared reference, copied into
/// the body), and a clone would cost two atomic reference-count updates per call. Any other
/// expression may name a parameter the body takes by value, so its coordinator is owned.
pub(super) fn coordinator(
    expr: Option<&Expr>,
    sig: &Signature,
    krate: &TokenStream,
    locals: &Locals,
) -> TokenStream {
    let coordinator = &locals.coordinator;
    match expr {
        None => quote! {
            let #coordinator = #krate::__private::default_coordinator();
        },
        Some(expr) if is_field_of_shared_self(expr, sig) => {
            let at = expr.span();
            let krate_at = respan(krate.clone(), at);
            quote_spanned! {at=>
                let #coordinator = #krate_at::__private::borrow_coordinator(&(#expr));
            }
        }
        Some(expr) => {
            let at = expr.span();
            let krate_at = respan(krate.clone(), at);
            let owned = &locals.owned;
            quote_spanned! {at=>
                let #owned = #krate_at::__private::own_coordinator(&(#expr));
                let #coordinator = &#owned;
            }
        }
    }
}

/// True for `self.a.b…` (named fields only) in a method whose receiver is `&self`.
fn is_field_of_shared_self(expr: &Expr, sig: &Signature) -> bool {
    let shared_self = matches!(
        sig.inputs.first(),
        Some(syn::FnArg::Receiver(receiver))
            if receiver.reference.is_some() && receiver.mutability.is_none()
                && receiver.colon_token.is_none()
    );
    if !shared_self {
        return false;
    }
    let mut at = expr;
    let mut fields = 0;
    loop {
        match at {
            Expr::Field(field) if field.attrs.is_empty() => {
                if !matches!(field.member, syn::Member::Named(_)) {
                    return false;
                }
                fields += 1;
                at = &field.base;
            }
            Expr::Path(path) => {
                return fields > 0
                    && path.attrs.is_empty()
                    && path.qself.is_none()
                    && path.path.is_ident("self");
            }
            _ => return false,
        }
    }
}

/// The statement binding [`Locals::call`]: the operation `op`, the coordinator and the key,
/// whose parts are each placed where the user named them in `key_from`.
pub(super) fn new_call(
    key: &[KeyPath],
    krate: &TokenStream,
    op: &Ident,
    locals: &Locals,
) -> TokenStream {
    let parts = key.iter().map(|path| {
        let value = borrow_path(path);
        let text = LitStr::new(&path.text(), Span::call_site());
        quote_spanned!(path.span=> .named_part(#text, #value))
    });
    let Locals {
        call,
        key,
        coordinator,
        ..
    } = locals;
    quote! {
        let #call = #krate::__private::Call::new(&#op, #coordinator, |#key| #key #(#parts)*);
    }
}

/// `&param.field...`, carrying the span the user wrote the path at.
pub(super) fn borrow_path(path: &KeyPath) -> TokenStream {
    let root = &path.root;
    let members = &path.members;
    quote_spanned!(path.span=> &#root #(.#members)*)
}
