//! The engine shared by the four attributes: parse the attribute being expanded and its
//! siblings into [`Args`], check them against the signature into a [`Stack`] (every mistake
//! reported with its span), then generate one function whose body runs inside the layers.
//!
//! Generation is split by what it writes. Each layer has its module ([`idempotency`],
//! [`cache`], [`single_flight`], [`lock`]) with its part of the operation's spec and its step
//! around the inner layers; [`call`] builds the call they share (the operation, the
//! coordinator, the key); [`function`] holds what concerns the function itself (the locals
//! it declares, its return type as the place bounds are checked, the user's body, the
//! reassembly). [`unparsed`] handles input that is not yet a function with a body.

mod cache;
mod call;
mod function;
mod idempotency;
mod lock;
mod multi_lock;
mod single_flight;
mod spans;
mod spec_values;
mod unparsed;

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::{AttrStyle, Attribute, Ident, ItemFn, Signature, Stmt};

use self::call::LayerSpecs;
use self::function::{Locals, ReturnSite};
use crate::args::Args;
use crate::errors::Errors;
use crate::fallback;
use crate::model::Stack;
use crate::options::Kind;

/// The item our expansion starts every function body with. Finding it on input means this
/// function was expanded already.
const MARKER: &str = "__COORD_STACK";

/// Expands the attribute `kind` with arguments `args` on `item`, taking in the sibling coord
/// attributes below it so the whole stack becomes one function.
///
/// Whatever is wrong, the function comes back out as written next to the errors, so the rest
/// of the crate (and an editor's completion in the body) still sees it.
pub(crate) fn expand_stack(kind: Kind, args: TokenStream, item: TokenStream) -> TokenStream {
    let mut func = match syn::parse2::<ItemFn>(item.clone()) {
        Ok(func) => func,
        Err(err) => return unparsed::expand(kind, args, item, err),
    };
    if already_expanded(&func) {
        return fallback::expanded_twice(kind, &func);
    }

    let (layers, mut errors, taken_in) = take_in(kind, args, &mut func.attrs);
    // The attributes taken in are never resolved by the compiler, which would then call their
    // imports unused: name each path once in the body instead.
    if !taken_in.is_empty() {
        let uses: Vec<Stmt> = taken_in
            .iter()
            .filter_map(|path| syn::parse2(quote!(#[allow(unused_imports)] use #path as _;)).ok())
            .collect();
        func.block.stmts.splice(0..0, uses);
    }

    let stack = build(kind, &layers, &func.sig, &mut errors);
    match (stack, errors.into_error()) {
        (Some(stack), None) => generate(&stack, &func),
        (_, Some(err)) => fallback::with_errors(err, func.to_token_stream()),
        // `Stack::build` fails with at least one error; this only keeps the fallback total.
        (None, None) => fallback::with_errors(
            syn::Error::new(Span::call_site(), "invalid coord attributes"),
            func.to_token_stream(),
        ),
    }
}

/// Parses the arguments of the attribute being expanded and takes in (removes from `attrs`)
/// the sibling coord attributes, parsing theirs too. Returns every layer, the errors found in
/// their arguments, and the paths the siblings were written with.
fn take_in(
    kind: Kind,
    args: TokenStream,
    attrs: &mut Vec<Attribute>,
) -> (Vec<Args>, Errors, Vec<syn::Path>) {
    let (primary, mut errors) = Args::parse_primary(kind, args);
    let mut layers = vec![primary];
    let mut taken_in = Vec::new();
    attrs.retain(|attr| match sibling_kind(attr) {
        Some(sibling) => {
            let (args, found) = Args::parse_sibling(sibling, attr);
            layers.push(args);
            errors.append(found);
            taken_in.push(attr.path().clone());
            false
        }
        None => true,
    });
    (layers, errors, taken_in)
}

/// The checks that need the signature: `async`, and the whole stack's options against the
/// parameters. Returns the stack when the options are consistent.
fn build(kind: Kind, layers: &[Args], sig: &Signature, errors: &mut Errors) -> Option<Stack> {
    if sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            sig.fn_token.span,
            format!(
                "#[{}] goes on an `async fn`: coordinating a call waits on the backend",
                kind.name()
            ),
        ));
    }
    match Stack::build(layers, sig) {
        Ok(stack) => Some(stack),
        Err(found) => {
            errors.append(found);
            None
        }
    }
}

/// The kind of a coord attribute among the function's outer attributes, recognised by the last
/// segment of its path (`idempotent`, `coord_core::idempotent`, ...).
fn sibling_kind(attr: &Attribute) -> Option<Kind> {
    if !matches!(attr.style, AttrStyle::Outer) {
        return None;
    }
    let last = attr.path().segments.last()?;
    if !last.arguments.is_none() {
        return None;
    }
    Kind::from_name(&last.ident.unraw().to_string())
}

fn already_expanded(func: &ItemFn) -> bool {
    matches!(
        func.block.stmts.first(),
        Some(Stmt::Item(syn::Item::Const(item))) if item.ident == MARKER
    )
}

/// The function with its body replaced by the layered call.
fn generate(stack: &Stack, func: &ItemFn) -> TokenStream {
    let krate = stack.krate.to_token_stream();
    let locals = Locals::new(&func.sig);
    let site = ReturnSite::new(&func.sig, &krate, &locals);
    let marker = format_ident!("{}", MARKER);
    let op = Ident::new("__COORD_OP", Span::call_site());

    let op_spec = call::op_spec(
        stack,
        &func.sig,
        &krate,
        LayerSpecs {
            idempotency: idempotency::spec(stack.idempotency.as_ref(), &krate),
            cache: cache::spec(stack.cache.as_ref(), &krate),
            lock: lock::spec(stack.lock.as_ref(), &krate),
        },
    );
    let coordinator = call::coordinator(stack.coordinator.as_ref(), &func.sig, &krate, &locals);
    // The key parts and the fingerprint are rendered before the body takes ownership of the
    // parameters.
    let new_call = call::new_call(&stack.key, &krate, &op, &locals);
    let fingerprint = stack
        .idempotency
        .as_ref()
        .map(|layer| idempotency::fingerprint(layer, &krate, &locals));
    let layered = layered(stack, &site, function::body(func, &site, &locals));
    let run = {
        let (at, call) = (site.at, &site.call);
        quote_spanned!(at=> #call.run(#layered).await)
    };

    let call = &locals.call;
    let statements = quote! {
        const #marker: () = ();
        static #op: #krate::__private::OpSpec = #op_spec;
        #coordinator
        #new_call
        #fingerprint
        let #call = &#call;
        #run
    };
    function::with_statements(func, statements)
}

/// `body` inside the stack's layers, innermost first: the lock, then single-flight, then the
/// cache, then idempotency outermost. A layer handed to another one is wrapped in an async
/// block, so the outer layer bounds a plain future rather than the inner layer's opaque one,
/// whose unmet bounds would otherwise be reported a second time.
fn layered(stack: &Stack, site: &ReturnSite, body: TokenStream) -> TokenStream {
    let present: Vec<Kind> = Kind::ALL
        .into_iter()
        .rev()
        .filter(|kind| stack.has(*kind))
        .collect();
    let mut layered = body;
    for (index, kind) in present.iter().enumerate() {
        let step = match kind {
            Kind::Idempotent => idempotency::wrap(stack.idempotency.as_ref(), site, layered),
            Kind::Cached => cache::wrap(stack.cache.as_ref(), site, layered),
            Kind::SingleFlight => single_flight::wrap(stack.cluster_flight.as_ref(), site, layered),
            Kind::DistributedLock => lock::wrap(stack.lock.as_ref(), site, layered),
        };
        layered = if index + 1 < present.len() {
            quote_spanned!(site.at=> async move { #step.await })
        } else {
            step
        };
    }
    layered
}

#[cfg(test)]
mod tests;
