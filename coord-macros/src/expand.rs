//! The engine shared by the three attributes, and the code it generates.

use proc_macro2::{Delimiter, Group, Literal, Span, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::spanned::Spanned;
use syn::{AttrStyle, Attribute, Ident, ItemFn, LitStr, ReturnType, Signature, Stmt, Visibility};

use crate::args::{Args, Errors, KeyPath};
use crate::fallback;
use crate::model::ClusterFlightLayer;
use crate::model::LeasePolicy;
use crate::model::Stack;
use crate::options::{Abandoned, Kind, Lost, MissingKey, Policy, Scope, StoreError};

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
        Err(err) => return expand_unparsed(kind, args, item, err),
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

/// A function whose signature parses but whose body is kept as tokens: what an editor sends
/// while someone is typing the body.
struct RawFn {
    attrs: Vec<Attribute>,
    vis: Visibility,
    sig: Signature,
    body: Group,
}

fn parse_raw_fn(input: ParseStream<'_>) -> syn::Result<RawFn> {
    let attrs = input.call(Attribute::parse_outer)?;
    let vis: Visibility = input.parse()?;
    let sig: Signature = input.parse()?;
    let body = match input.parse::<TokenTree>()? {
        TokenTree::Group(group) if group.delimiter() == Delimiter::Brace => group,
        other => return Err(syn::Error::new(other.span(), "expected a body")),
    };
    if !input.is_empty() {
        return Err(input.error("expected nothing after the body"));
    }
    Ok(RawFn {
        attrs,
        vis,
        sig,
        body,
    })
}

/// The item did not parse as a function. When it is a function with a body that does not parse
/// yet (a missing `;`, an unfinished expression), `parse_error` is the real mistake: report it
/// where it is, with every error in the attributes, instead of claiming the attribute is
/// misplaced, and emit the function as written so the compiler and the editor still see it.
fn expand_unparsed(
    kind: Kind,
    args: TokenStream,
    item: TokenStream,
    parse_error: syn::Error,
) -> TokenStream {
    if let Ok(mut raw) = parse_raw_fn.parse2(item.clone()) {
        let (layers, mut errors, taken_in) = take_in(kind, args, &mut raw.attrs);
        // The stack is only checked: a body that does not parse cannot be wrapped.
        let _ = build(kind, &layers, &raw.sig, &mut errors);
        let RawFn {
            attrs,
            vis,
            sig,
            body,
        } = raw;
        let body = name_taken_in(&body, &taken_in);
        let tokens = quote!(#(#attrs)* #vis #sig #body);
        return fallback::with_errors(errors.then(parse_error), tokens);
    }
    let split = |input: ParseStream<'_>| -> syn::Result<(Vec<Attribute>, Vec<TokenTree>)> {
        let attrs = input.call(Attribute::parse_outer)?;
        let rest: TokenStream = input.parse()?;
        Ok((attrs, rest.into_iter().collect()))
    };
    match split.parse2(item.clone()) {
        // A signature still being typed: syn's error says what is wrong with it. The other
        // coord attributes are taken in, so that they do not repeat the same error.
        Ok((mut attrs, mut rest)) if looks_like_fn_with_body(&rest) => {
            let (_, errors, taken_in) = take_in(kind, args, &mut attrs);
            if let Some(TokenTree::Group(body)) = rest.pop() {
                rest.push(TokenTree::Group(name_taken_in(&body, &taken_in)));
            }
            let tokens = quote!(#(#attrs)* #(#rest)*);
            fallback::with_errors(errors.then(parse_error), tokens)
        }
        // Not a function. The other coord attributes stay on the item and report for
        // themselves; this one reports its arguments' mistakes and where it belongs.
        _ => {
            let (_, errors) = Args::parse_primary(kind, args);
            fallback::not_a_function(kind, errors, item)
        }
    }
}

/// `body` with a `use` of each taken-in attribute's path after its inner attributes: the
/// attributes taken in are never resolved by the compiler, which would then call their imports
/// unused.
fn name_taken_in(body: &Group, taken_in: &[syn::Path]) -> Group {
    let mut tokens: Vec<TokenTree> = body.stream().into_iter().collect();
    // Inner attributes (`#![...]`) must stay first in the block.
    let mut inner_end = 0;
    while let [
        TokenTree::Punct(hash),
        TokenTree::Punct(bang),
        TokenTree::Group(attr),
        ..,
    ] = &tokens[inner_end..]
    {
        if hash.as_char() != '#' || bang.as_char() != '!' || attr.delimiter() != Delimiter::Bracket
        {
            break;
        }
        inner_end += 3;
    }
    let uses = taken_in
        .iter()
        .flat_map(|path| quote!(#[allow(unused_imports)] use #path as _;));
    tokens.splice(inner_end..inner_end, uses);
    let mut named = Group::new(body.delimiter(), tokens.into_iter().collect());
    named.set_span(body.span());
    named
}

/// Whether `tokens` (an item without its outer attributes) read as a function with a body: an
/// `fn` at the top level, and a `{ ... }` at the end.
fn looks_like_fn_with_body(tokens: &[TokenTree]) -> bool {
    let has_fn = tokens
        .iter()
        .any(|token| matches!(token, TokenTree::Ident(ident) if ident == "fn"));
    let ends_in_body = matches!(
        tokens.last(),
        Some(TokenTree::Group(group)) if group.delimiter() == Delimiter::Brace
    );
    has_fn && ends_in_body
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

/// `tokens` with every token moved to `span`, so errors about them land there.
fn respan(tokens: TokenStream, span: Span) -> TokenStream {
    tokens
        .into_iter()
        .map(|token| match token {
            TokenTree::Group(group) => {
                let mut new = Group::new(group.delimiter(), respan(group.stream(), span));
                new.set_span(span);
                TokenTree::Group(new)
            }
            mut other => {
                other.set_span(span);
                other
            }
        })
        .collect()
}

/// The span of the first token of `tokens`, or the call site when there is none.
fn first_span(tokens: &TokenStream) -> Span {
    tokens
        .clone()
        .into_iter()
        .next()
        .map_or_else(Span::call_site, |token| match token {
            TokenTree::Group(group) => group.span_open(),
            other => other.span(),
        })
}

fn with_span(ident: &Ident, span: Span) -> Ident {
    let mut placed = ident.clone();
    placed.set_span(span);
    placed
}

/// True when `tokens` mention `impl`: such a return type cannot be written as a `let` type.
fn mentions_impl(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|token| match token {
        TokenTree::Ident(ident) => ident == "impl",
        TokenTree::Group(group) => mentions_impl(group.stream()),
        _ => false,
    })
}

/// `&param.field...`, carrying the span the user wrote the path at.
fn borrow_path(path: &KeyPath) -> TokenStream {
    let root = &path.root;
    let members = &path.members;
    quote_spanned!(path.span=> &#root #(.#members)*)
}

/// The `Written` set of a spec, as a const expression.
fn written(krate: &TokenStream, flags: &[&str]) -> TokenStream {
    let flags = flags.iter().map(|flag| Ident::new(flag, Span::call_site()));
    quote!(#krate::__private::Written::NONE #(.with(#krate::__private::Written::#flags))*)
}

fn millis(krate: &TokenStream, ms: u64) -> TokenStream {
    let ms = Literal::u64_suffixed(ms);
    quote!(#krate::__private::Duration::from_millis(#ms))
}

/// The `renew` and `on_lost` fields of a spec.
fn lease_policy(krate: &TokenStream, lease: &LeasePolicy) -> (TokenStream, TokenStream) {
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

fn policy(krate: &TokenStream, policy: Option<Policy>) -> TokenStream {
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

/// The cluster-scope single-flight call. Its bound (`ClusterOutput`) checks the output at the
/// return type. Whether errors are handed over is picked here, where the output type is
/// concrete: the probe resolves to the shared form when the error type is serialisable, and
/// to the opaque one (followers get `LeaderFailed`) otherwise.
fn cluster_flight_call(
    layer: &ClusterFlightLayer,
    krate: &TokenStream,
    at_ret: Span,
    typed_ret: Option<&TokenStream>,
    call: &Ident,
    inner: TokenStream,
) -> TokenStream {
    let lease = respan(millis(krate, layer.lease_ms), at_ret);
    let errors = match typed_ret {
        Some(ret) => quote_spanned! {at_ret=>
            {
                #[allow(unused_imports)]
                use #krate::__private::{OpaqueErrorProbe as _, SharedErrorProbe as _};
                (&&#krate::__private::FlightProbe::<#ret>::new()).error_form()
            }
        },
        None => quote_spanned!(at_ret=> #krate::__private::opaque_errors()),
    };
    quote_spanned! {at_ret=>
        #krate::__private::cluster_single_flight(
            #call,
            #krate::__private::ClusterFlightSpec { lease: #lease },
            #errors,
            #inner,
        )
    }
}

/// The function with its body replaced by the layered call.
fn generate(stack: &Stack, func: &ItemFn) -> TokenStream {
    let krate = stack.krate.to_token_stream();
    // Generated locals are declared at the call site (not `mixed_site`) because some uses of
    // them are placed at the user's return type; their prefix keeps them apart from user names.
    // They resolve where the function itself was written: when a user's macro writes the
    // attributes and the function in different expansions, the attribute's call site and the
    // return type belong to different hygiene contexts, and only the function's is shared by
    // every place they are used.
    let hidden = Span::call_site().resolved_at(func.sig.fn_token.span);
    let call = Ident::new("__coord_call", hidden);
    let key = Ident::new("__coord_key", hidden);
    let fingerprint = Ident::new("__coord_fingerprint", hidden);
    let coordinator = Ident::new("__coord_coordinator", hidden);
    let owned = Ident::new("__coord_owned", hidden);
    let fake_return = Ident::new("__coord_fake_return", hidden);
    let marker = format_ident!("{}", MARKER);
    let op = Ident::new("__COORD_OP", Span::call_site());

    // The layer calls are what check the return type: `GuardedResult` (a `Result` whose error
    // converts from `CoordError`) for idempotency and the lock, `Clone + Send + 'static` for
    // single-flight. They are placed at the return type's first token (at the `)` closing the
    // parameters when there is none), so an unmet bound is reported there, once.
    let (at_ret, typed_ret) = match &func.sig.output {
        ReturnType::Type(_, ty) => {
            let ret = ty.to_token_stream();
            (
                first_span(&ret),
                (!mentions_impl(ret.clone())).then_some(ret),
            )
        }
        ReturnType::Default => (func.sig.paren_token.span.close(), None),
    };
    let krate_here = respan(krate.clone(), at_ret);

    let name = match &stack.name {
        Some(name) => LitStr::new(name, Span::call_site()).to_token_stream(),
        None => {
            let fn_name = func.sig.ident.unraw().to_string();
            quote!(::core::concat!(::core::module_path!(), "::", #fn_name))
        }
    };
    let record_key = stack.record_key;
    let idempotency_spec = match &stack.idempotency {
        None => quote!(::core::option::Option::None),
        Some(layer) => {
            let retention = millis(&krate, layer.retention_ms);
            let in_flight_lease = millis(&krate, layer.in_flight_lease_ms);
            let wait = millis(&krate, layer.wait_ms);
            let on_backend_error = policy(&krate, layer.on_backend_error);
            let (renew, on_lost) = lease_policy(&krate, &layer.lease_policy);
            let on_abandoned = match layer.on_abandoned {
                Abandoned::Rerun => quote!(#krate::__private::OnAbandoned::Rerun),
                Abandoned::Fail => quote!(#krate::__private::OnAbandoned::Fail),
            };
            let on_store_error = match layer.on_store_error {
                StoreError::Error => quote!(#krate::__private::OnStoreError::Error),
                StoreError::ReturnOk => quote!(#krate::__private::OnStoreError::ReturnOk),
            };
            let written = written(&krate, &layer.written);
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
    };
    let lock_spec = match &stack.lock {
        None => quote!(::core::option::Option::None),
        Some(layer) => {
            let lease = millis(&krate, layer.lease_ms);
            let wait = millis(&krate, layer.wait_ms);
            let fenced = layer.fenced;
            let written = written(&krate, &layer.written);
            let on_backend_error = policy(&krate, layer.on_backend_error);
            let (renew, on_lost) = lease_policy(&krate, &layer.lease_policy);
            quote! {
                ::core::option::Option::Some(#krate::__private::LockSpec {
                    lease: #lease,
                    wait: #wait,
                    fenced: #fenced,
                    on_backend_error: #on_backend_error,
                    renew: #renew,
                    on_lost: #on_lost,
                    written: #written,
                })
            }
        }
    };
    let profile = match &stack.profile {
        None => quote!(::core::option::Option::None),
        Some(name) => {
            let name = LitStr::new(name, Span::call_site());
            quote!(::core::option::Option::Some(#name))
        }
    };

    let cache_spec = match &stack.cache {
        None => quote!(::core::option::Option::None),
        Some(layer) => {
            let ttl = millis(&krate, layer.ttl_ms);
            let local_ttl = millis(&krate, layer.local_ttl_ms);
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
    };
    // The form checks the output's bounds for the scope: clones in memory for `local`, serde
    // for the shared tier (the whole `Result` with `cache_err`).
    let cache_form = stack
        .cache
        .as_ref()
        .map(|layer| match (layer.scope, layer.cache_err) {
            (Scope::Local, _) => quote!(local_form),
            (_, false) => quote!(shared_form),
            (_, true) => quote!(shared_result_form),
        });

    let coordinator_stmt = match &stack.coordinator {
        None => quote! {
            let #coordinator = #krate::__private::default_coordinator();
        },
        Some(expr) => {
            let at = expr.span();
            let krate_at = respan(krate.clone(), at);
            quote_spanned! {at=>
                let #owned = #krate_at::__private::own_coordinator(&(#expr));
                let #coordinator = &#owned;
            }
        }
    };

    // Key parts are rendered here, before the body takes ownership of the parameters.
    let parts = stack.key.iter().map(|path| {
        let value = borrow_path(path);
        let text = LitStr::new(&path.text(), Span::call_site());
        quote_spanned!(path.span=> .named_part(#text, #value))
    });
    let fingerprint_stmt = stack.idempotency.as_ref().map(|layer| {
        if layer.fingerprint.is_empty() {
            quote!(let #fingerprint = ::core::option::Option::None;)
        } else {
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
    });

    // The user's block keeps its own scope; a `return` in it leaves this async block. The
    // never-taken branch tells inference the block's output type up front, as the function's
    // signature did for the original body.
    // The braces are re-marked as generated (at the same place), so that lints about a block
    // nested in a block do not fire on the user's body.
    let stmts = &func.block.stmts;
    let mut body = Group::new(Delimiter::Brace, quote!(#(#stmts)*));
    body.set_span(Span::call_site().located_at(func.block.brace_token.span.join()));
    let typed_edge = match &typed_ret {
        Some(ret) => quote_spanned! {at_ret=>
            #[allow(
                unreachable_code,
                clippy::diverging_sub_expression,
                clippy::empty_loop,
                clippy::let_unit_value,
                clippy::needless_return,
                clippy::unreachable
            )]
            if false {
                let #fake_return: #ret = loop {};
                return #fake_return;
            }
        },
        None => TokenStream::new(),
    };
    // Innermost first: lock, then single-flight, then the cache, then idempotency outermost. The layer calls
    // sit at the return type too (see above). A layer handed to another one is wrapped in an
    // async block, so the outer layer bounds a plain future rather than the inner layer's
    // opaque one, whose unmet bounds would otherwise be reported a second time.
    let call_here = with_span(&call, at_ret);
    let fingerprint_here = with_span(&fingerprint, at_ret);
    let layer_call = |kind: Kind, inner: TokenStream| match kind {
        Kind::Idempotent => quote_spanned! {at_ret=>
            #krate_here::__private::idempotent(#call_here, #fingerprint_here, #inner)
        },
        Kind::Cached => {
            let form = cache_form.clone().unwrap_or_else(|| quote!(local_form));
            let form = respan(form, at_ret);
            quote_spanned! {at_ret=>
                #krate_here::__private::cached(#call_here, #krate_here::__private::#form(), #inner)
            }
        }
        Kind::SingleFlight => match &stack.cluster_flight {
            None => quote_spanned! {at_ret=>
                #krate_here::__private::single_flight(#call_here, #inner)
            },
            Some(layer) => cluster_flight_call(
                layer,
                &krate_here,
                at_ret,
                typed_ret.as_ref(),
                &call_here,
                inner,
            ),
        },
        Kind::DistributedLock => quote_spanned! {at_ret=>
            #krate_here::__private::distributed_lock(#call_here, #inner)
        },
    };
    let present: Vec<Kind> = Kind::ALL
        .into_iter()
        .rev()
        .filter(|kind| stack.has(*kind))
        .collect();
    let mut layered = quote!(#call_here.body(async move { #typed_edge #body }));
    for (index, kind) in present.iter().enumerate() {
        let call = layer_call(*kind, layered);
        layered = if index + 1 < present.len() {
            quote_spanned!(at_ret=> async move { #call.await })
        } else {
            call
        };
    }
    let run = quote_spanned!(at_ret=> #call_here.run(#layered).await);

    let statements = quote! {
        const #marker: () = ();
        static #op: #krate::__private::OpSpec = #krate::__private::OpSpec {
            name: #name,
            idempotency: #idempotency_spec,
            cache: #cache_spec,
            lock: #lock_spec,
            telemetry: #krate::__private::OpTelemetry::new(),
            record_key: #record_key,
            profile: #profile,
        };
        #coordinator_stmt
        let #call = #krate::__private::Call::new(&#op, #coordinator, |#key| #key #(#parts)*);
        #fingerprint_stmt
        let #call = &#call;
        #run
    };

    let outer = func
        .attrs
        .iter()
        .filter(|a| matches!(a.style, AttrStyle::Outer));
    let inner = func
        .attrs
        .iter()
        .filter(|a| matches!(a.style, AttrStyle::Inner(_)));
    let vis = &func.vis;
    let sig = &func.sig;
    let mut block = Group::new(Delimiter::Brace, quote!(#(#inner)* #statements));
    block.set_span(func.block.brace_token.span.join());
    quote! {
        #(#outer)*
        #vis #sig #block
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand(kind: Kind, args: &str, item: &str) -> String {
        let args: TokenStream = args.parse().expect("test args lex");
        let item: TokenStream = item.parse().expect("test item lexes");
        expand_stack(kind, args, item).to_string()
    }

    fn position(haystack: &str, needle: &str) -> usize {
        haystack
            .find(needle)
            .unwrap_or_else(|| panic!("`{needle}` not in:\n{haystack}"))
    }

    /// Stacks whose whole expansion is compared with a stored copy, one per file under
    /// `src/expand/snapshots/`. Between them they take every branch of the generator: each
    /// layer alone and all four together, every cache scope, the cluster flight, no return
    /// type, an `impl` return type, a method, a coordinator expression, a renamed crate,
    /// inner attributes and taken-in sibling paths.
    const SNAPSHOTS: [(&str, Kind, &str, &str); 10] = [
        (
            "idempotent_every_option",
            Kind::Idempotent,
            "key_from = [\"order.customer_id\", region], fingerprint = [\"order\", region], \
             retention = \"1h\", in_flight_lease = \"1m\", wait = \"2s\", \
             on_backend_error = fail_open, renew = \"15s\", on_lost = signal, \
             on_abandoned = fail, on_store_error = return_ok, \
             on_missing_key = run_unprotected, name = \"payments.charge\", record_key = true, \
             profile = \"payments\", coordinator = \"&self.coordinator\"",
            "/// Charges. \n #[inline] pub async fn charge(&self, order: Order, region: String) \
             -> Result<u64, PaymentError> { #![allow(unused)] Ok(order.cents) }",
        ),
        (
            "every_layer",
            Kind::DistributedLock,
            "lease = \"5m\", wait = \"1s\", fenced = true, renew = true",
            "#[coord_core::cached(ttl = \"30s\", scope = two_tier, cache_err = true, \
             max_capacity = 500)] #[single_flight] #[idempotent(key_from = \"id\")] \
             async fn f(id: u64) -> Result<u64, E> { Ok(id) }",
        ),
        (
            "cached_local",
            Kind::Cached,
            "key_from = \"self.id\", ttl = \"1m\"",
            "async fn quote(self: Arc<Self>) -> Result<u64, String> { Ok(self.id) }",
        ),
        (
            "cached_shared",
            Kind::Cached,
            "key_from = symbol, ttl = \"10s\", scope = \"shared\", crate = \"coord\"",
            "async fn quote(symbol: String) -> Result<u64, String> { Ok(symbol.len() as u64) }",
        ),
        (
            "cached_two_tier_local_ttl",
            Kind::Cached,
            "ttl = \"10s\", scope = two_tier, local_ttl = \"2s\"",
            "async fn quote() -> Result<u64, String> { Ok(1) }",
        ),
        (
            "single_flight_process_no_return_type",
            Kind::SingleFlight,
            "",
            "async fn warm() { }",
        ),
        (
            "single_flight_impl_return_type",
            Kind::SingleFlight,
            "key_from = \"id\"",
            "async fn f(id: u64) -> impl Clone + Send + 'static { id }",
        ),
        (
            "single_flight_cluster",
            Kind::SingleFlight,
            "key_from = \"id\", scope = cluster, lease = \"3s\"",
            "#[coord_core::distributed_lock(on_backend_error = \"fail_closed\", renew = \"5s\", \
             on_lost = signal)] async fn f(id: u64) -> Result<u64, E> { Ok(id) }",
        ),
        (
            "single_flight_cluster_impl_return_type",
            Kind::SingleFlight,
            "scope = cluster",
            "async fn f() -> Result<impl Serialize, E> { Ok(1) }",
        ),
        (
            "lock_defaults",
            Kind::DistributedLock,
            "",
            "async fn rebuild(&mut self) -> Result<(), CoordError> { Ok(()) }",
        ),
    ];

    /// The expansion, one statement a line, so that a difference reads as a diff.
    fn readable(expansion: &str) -> String {
        let mut lines = expansion.replace("; ", ";\n");
        lines.push('\n');
        lines
    }

    /// The generated code changes only on purpose: each stack's expansion is the stored one.
    /// After a deliberate change, run the tests with `COORD_MACROS_BLESS=1` to store the new
    /// expansions, and review their diff.
    #[test]
    fn expansions_match_their_snapshots() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/expand/snapshots");
        let bless = std::env::var_os("COORD_MACROS_BLESS").is_some();
        let mut stale = Vec::new();
        for (name, kind, args, item) in SNAPSHOTS {
            let out = readable(&expand(kind, args, item));
            assert!(!out.contains("compile_error"), "{name}: {out}");
            let file = dir.join(format!("{name}.txt"));
            if bless {
                std::fs::create_dir_all(&dir).expect("create the snapshot directory");
                std::fs::write(&file, &out).expect("write a snapshot");
                continue;
            }
            let stored = std::fs::read_to_string(&file)
                .unwrap_or_else(|err| panic!("{}: {err}", file.display()));
            if stored != out {
                stale.push(format!("{name}:\n--- stored\n{stored}\n+++ now\n{out}"));
            }
        }
        assert!(stale.is_empty(), "expansions changed:\n{}", stale.join("\n"));
    }

    #[test]
    fn layers_nest_in_canonical_order_whatever_the_written_order() {
        let out = expand(
            Kind::DistributedLock,
            "lease = \"5m\"",
            "#[single_flight] #[coord_core::idempotent(key_from = \"id\")] \
             async fn f(id: u64) -> Result<u64, E> { Ok(id) }",
        );
        let idem = position(&out, ":: idempotent (");
        let flight = position(&out, ":: single_flight (");
        let lock = position(&out, ":: distributed_lock (");
        assert!(idem < flight && flight < lock, "{out}");
        assert!(!out.contains("# [single_flight]"), "{out}");
        assert!(out.contains("from_millis (300000u64)"), "{out}");
        assert!(!out.contains("compile_error"), "{out}");
    }

    #[test]
    fn the_cache_sits_between_idempotency_and_single_flight_in_every_written_order() {
        let layers = [
            "#[idempotent(key_from = \"id\")]",
            "#[cached(ttl = \"1m\")]",
            "#[single_flight]",
            "#[distributed_lock]",
        ];
        // Every rotation and its reverse: each attribute is written first, last and between.
        for start in 0..layers.len() {
            for reverse in [false, true] {
                let mut order: Vec<&str> = (0..layers.len())
                    .map(|i| layers[(start + i) % layers.len()])
                    .collect();
                if reverse {
                    order.reverse();
                }
                let (first, rest) = order.split_first().expect("four layers");
                let (name, args) = first
                    .trim_start_matches("#[")
                    .trim_end_matches(']')
                    .split_once('(')
                    .map_or(
                        (first.trim_start_matches("#[").trim_end_matches(']'), ""),
                        |(n, a)| (n, a.trim_end_matches(')')),
                    );
                let kind = Kind::from_name(name).expect("a coord attribute");
                let item = format!(
                    "{} async fn f(id: u64) -> Result<u64, E> {{ Ok(id) }}",
                    rest.join(" ")
                );
                let out = expand(kind, args, &item);
                assert!(!out.contains("compile_error"), "{order:?}: {out}");
                let idem = position(&out, ":: idempotent (");
                let cache = position(&out, ":: cached (");
                let flight = position(&out, ":: single_flight (");
                let lock = position(&out, ":: distributed_lock (");
                assert!(
                    idem < cache && cache < flight && flight < lock,
                    "{order:?}: {out}"
                );
                assert!(out.contains(":: local_form ()"), "{out}");
            }
        }
    }

    #[test]
    fn the_scope_picks_the_form_that_checks_the_output() {
        let item = "async fn f(id: u64) -> Result<u64, E> { Ok(id) }";
        let out = expand(Kind::Cached, "ttl = \"1s\", scope = \"shared\"", item);
        assert!(out.contains(":: shared_form ()"), "{out}");
        let out = expand(
            Kind::Cached,
            "ttl = \"1s\", scope = two_tier, cache_err = true",
            item,
        );
        assert!(out.contains(":: shared_result_form ()"), "{out}");
        // A tenth of the TTL is the two-tier default local TTL.
        assert!(out.contains("from_millis (100u64)"), "{out}");
    }

    #[test]
    fn foreign_attributes_stay_in_their_order() {
        let out = expand(
            Kind::SingleFlight,
            "",
            "/// Docs. \n #[inline] #[distributed_lock] #[cfg(all())] #[allow(dead_code)] \
             pub async fn f() -> Result<(), E> { Ok(()) }",
        );
        let doc = position(&out, "doc =");
        let inline = position(&out, "# [inline]");
        let cfg = position(&out, "# [cfg (all ())]");
        let allow = position(&out, "# [allow (dead_code)]");
        assert!(doc < inline && inline < cfg && cfg < allow, "{out}");
        assert!(out.starts_with("# [doc"), "{out}");
        assert!(out.contains("pub async fn f ()"), "{out}");
    }

    #[test]
    fn errors_keep_the_function_and_drop_the_taken_in_attributes() {
        let out = expand(
            Kind::Idempotent,
            "",
            "#[distributed_lock(lease = \"soon\")] async fn f(id: u64) -> Result<(), E> { Ok(()) }",
        );
        assert_eq!(out.matches("compile_error").count(), 2, "{out}");
        assert!(out.contains("async fn f (id : u64)"), "{out}");
        assert!(!out.contains("# [distributed_lock"), "{out}");
        assert!(!out.contains(MARKER), "{out}");
    }

    #[test]
    fn a_second_expansion_is_refused() {
        let once = expand(
            Kind::DistributedLock,
            "",
            "async fn f() -> Result<(), E> { Ok(()) }",
        );
        let twice = expand(Kind::Idempotent, "key_from = \"x\"", &once);
        assert!(twice.contains("compile_error"), "{twice}");
        assert!(twice.contains("was not taken in"), "{twice}");
    }

    #[test]
    fn odd_input_gives_errors_not_panics() {
        let item = "async fn f(id: u64, (a, b): (u8, u8), s: S) -> Result<(), E> { Ok(()) }";
        for args in [
            "key_from",
            "key_from =",
            "= 3",
            "key_from = [1, 2]",
            "key_from = []",
            "key_from = \"\"",
            "key_from = \"a..b\"",
            "key_from = \"0\"",
            "key_from = \"r#type\"",
            "key_from = \"fn\"",
            "key_from = \"self\"",
            "key_from = id()",
            "key_from = \"id\" lease",
            "crate = 5",
            "crate = \"::\"",
            "name = \"\u{e9}\"",
            "name = \"\"",
            "name = 5",
            "coordinator = \"(\"",
            "coordinator = \"\"",
            "lease = 5",
            "lease = \"0s\"",
            "lease = \"99999999999999999999999h\"",
            "fenced = 1",
            "on_backend_error = 3",
            "on_backend_error = fail_open, on_backend_error = \"x\"",
            "renew = \"10s\", on_lost = \"abort\"",
            "key_from = \"id\",,",
            "(key_from = \"id\")",
        ] {
            for kind in Kind::ALL {
                let out = expand(kind, args, item);
                assert!(out.contains("compile_error"), "{kind:?} {args}: {out}");
                assert!(out.contains("async fn f"), "{kind:?} {args}: {out}");
            }
        }
    }

    #[test]
    fn bare_and_tuple_field_paths_are_accepted() {
        let item = "async fn f(id: (u64, u8), s: S) -> Result<(), E> { Ok(()) }";
        for args in [
            "key_from = \"s.0\"",
            "key_from = id.0",
            "key_from = [s.name, \"id\"]",
        ] {
            let out = expand(Kind::DistributedLock, args, item);
            assert!(!out.contains("compile_error"), "{args}: {out}");
        }
    }

    #[test]
    fn non_functions_are_passed_through_with_an_error() {
        let out = expand(Kind::SingleFlight, "", "struct S;");
        assert!(out.contains("compile_error"), "{out}");
        assert!(out.contains("struct S ;"), "{out}");
        let out = expand(Kind::SingleFlight, "", "async fn f(&self);");
        assert!(out.contains("compile_error"), "{out}");
    }

    #[test]
    fn a_half_typed_body_gets_the_parse_error_and_comes_back_as_written() {
        let out = expand(
            Kind::DistributedLock,
            "lease = \"soon\"",
            "#[coord_core::single_flight] async fn f(id: u64) -> Result<u64, E> { \
             #![allow(unused)] let doubled = id * 2 Ok(doubled) }",
        );
        assert!(!out.contains("goes on an `async fn` with a body"), "{out}");
        assert!(out.contains("expected `;`"), "{out}");
        assert!(out.contains("invalid duration"), "{out}");
        // The body as written, the taken-in attribute named after its inner attributes.
        assert!(
            out.contains(
                "{ #! [allow (unused)] # [allow (unused_imports)] use coord_core :: single_flight as _ ; \
                 let doubled = id * 2 Ok (doubled) }"
            ),
            "{out}"
        );
        assert!(!out.contains("# [coord_core :: single_flight]"), "{out}");
        assert!(!out.contains(MARKER), "{out}");
    }

    #[test]
    fn a_half_typed_signature_gets_the_parse_error() {
        let out = expand(
            Kind::SingleFlight,
            "",
            "async fn f(id: u64,, x: u8) -> Result<u64, E> { Ok(id) }",
        );
        assert!(!out.contains("goes on an `async fn` with a body"), "{out}");
        assert!(out.contains("compile_error"), "{out}");
        assert!(out.contains("{ Ok (id) }"), "{out}");
    }

    #[test]
    fn a_non_function_reports_its_arguments_and_keeps_the_other_attributes() {
        let out = expand(
            Kind::Idempotent,
            "retention = \"forever\"",
            "#[single_flight] struct S;",
        );
        assert!(out.contains("invalid duration"), "{out}");
        assert!(out.contains("goes on an `async fn` with a body"), "{out}");
        assert!(out.contains("# [single_flight] struct S ;"), "{out}");
    }

    #[test]
    fn options_left_out_take_the_table_defaults() {
        let out = expand(
            Kind::Idempotent,
            "key_from = \"id\"",
            "#[distributed_lock] async fn f(id: u64) -> Result<(), E> { Ok(()) }",
        );
        // One field of the `IdempotencySpec` or the `LockSpec`, as rendered.
        let field = |spec: &str, name: &str| {
            let section = &out[position(&out, &format!("{spec} {{"))..];
            let at = position(section, &format!(" {name} :"));
            section[at..]
                .split(',')
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned()
        };
        let idem = |name: &str| field("IdempotencySpec", name);
        let lock = |name: &str| field("LockSpec", name);
        assert!(
            idem("retention").ends_with("from_millis (86400000u64)"),
            "{out}"
        );
        assert!(
            idem("in_flight_lease").ends_with("from_millis (30000u64)"),
            "{out}"
        );
        assert!(idem("wait").ends_with("from_millis (0u64)"), "{out}");
        assert!(idem("renew").ends_with("None"), "{out}");
        assert!(idem("on_lost").ends_with("None"), "{out}");
        assert!(idem("on_backend_error").ends_with("None"), "{out}");
        assert!(
            idem("on_abandoned").ends_with("OnAbandoned :: Rerun"),
            "{out}"
        );
        assert!(
            idem("on_store_error").ends_with("OnStoreError :: Error"),
            "{out}"
        );
        assert!(
            idem("on_missing_key").ends_with("OnMissingKey :: Fail"),
            "{out}"
        );
        assert!(lock("lease").ends_with("from_millis (30000u64)"), "{out}");
        assert!(lock("wait").ends_with("from_millis (0u64)"), "{out}");
        assert_eq!(lock("fenced"), "fenced : false", "{out}");
        assert!(lock("renew").ends_with("None"), "{out}");
        assert!(lock("on_lost").ends_with("None"), "{out}");
    }

    #[test]
    fn written_options_override_the_defaults() {
        let out = expand(
            Kind::Idempotent,
            "key_from = \"id\", retention = \"1h\", on_abandoned = fail, \
             on_store_error = \"return_ok\", on_missing_key = \"run_unprotected\", renew = true",
            "async fn f(id: Option<u64>) -> Result<(), E> { Ok(()) }",
        );
        assert!(
            out.contains(
                "retention : :: coord_core :: __private :: Duration :: from_millis (3600000u64)"
            ),
            "{out}"
        );
        assert!(out.contains("OnAbandoned :: Fail"), "{out}");
        assert!(out.contains("OnStoreError :: ReturnOk"), "{out}");
        assert!(out.contains("OnMissingKey :: RunUnprotected"), "{out}");
        // `renew = true`: every third of the in-flight lease, and `on_lost` becomes `cancel`.
        assert!(out.contains("from_millis (10000u64)"), "{out}");
        assert!(out.contains("OnLost :: Cancel"), "{out}");
    }

    #[test]
    fn key_parts_follow_key_from_and_fingerprint_is_optional() {
        let out = expand(
            Kind::Idempotent,
            "key_from = [\"order.customer_id\", region], fingerprint = [\"order\"]",
            "async fn f(order: Order, region: String) -> Result<(), E> { Ok(()) }",
        );
        assert!(
            out.contains(
                ". named_part (\"order.customer_id\" , & order . customer_id) . named_part (\"region\" , & region)"
            ),
            "{out}"
        );
        assert!(out.contains(". param (& order) . finish ()"), "{out}");

        let out = expand(
            Kind::Idempotent,
            "key_from = \"id\"",
            "async fn f(id: u64) -> Result<(), E> { Ok(()) }",
        );
        assert!(
            out.contains("let __coord_fingerprint = :: core :: option :: Option :: None"),
            "{out}"
        );
    }

    #[test]
    fn cluster_scope_adds_the_cluster_step_with_its_lease_and_error_probe() {
        let item = "async fn f(id: u64) -> Result<u64, E> { Ok(id) }";
        let out = expand(Kind::SingleFlight, "scope = \"cluster\"", item);
        assert!(out.contains(":: cluster_single_flight ("), "{out}");
        assert!(out.contains("from_millis (10000u64)"), "{out}");
        assert!(
            out.contains(":: FlightProbe :: < Result < u64 , E > > :: new ()"),
            "{out}"
        );
        let out = expand(Kind::SingleFlight, "scope = cluster, lease = \"3s\"", item);
        assert!(out.contains("from_millis (3000u64)"), "{out}");
        let out = expand(Kind::SingleFlight, "", item);
        assert!(!out.contains("cluster_single_flight"), "{out}");
        assert!(out.contains(":: single_flight ("), "{out}");
        let out = expand(Kind::SingleFlight, "lease = \"3s\"", item);
        assert!(out.contains("compile_error"), "{out}");
    }
}
