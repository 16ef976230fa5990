//! The engine shared by the three attributes, and the code it generates.

use proc_macro2::{Delimiter, Group, Literal, Span, TokenStream, TokenTree};
use quote::{ToTokens, format_ident, quote, quote_spanned};
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{AttrStyle, Attribute, Ident, ItemFn, LitStr, ReturnType, Stmt};

use crate::args::{Args, KeyPath, Kind, Policy};
use crate::fallback;
use crate::model::Stack;

/// The item our expansion starts every function body with. Finding it on input means this
/// function was expanded already.
const MARKER: &str = "__COORD_STACK";

/// Expands the attribute `kind` with arguments `args` on `item`, taking in the sibling coord
/// attributes below it so the whole stack becomes one function.
pub(crate) fn expand_stack(kind: Kind, args: TokenStream, item: TokenStream) -> TokenStream {
    let Ok(mut func) = syn::parse2::<ItemFn>(item.clone()) else {
        return fallback::not_a_function(kind, item);
    };
    if already_expanded(&func) {
        return fallback::expanded_twice(kind, &func);
    }

    let (primary, mut errors) = Args::parse_primary(kind, args);
    let mut layers = vec![primary];
    func.attrs.retain(|attr| match sibling_kind(attr) {
        Some(sibling) => {
            let (args, found) = Args::parse_sibling(sibling, attr);
            layers.push(args);
            errors.append(found);
            false
        }
        None => true,
    });

    if func.sig.asyncness.is_none() {
        errors.push(syn::Error::new(
            func.sig.fn_token.span,
            format!(
                "#[{}] goes on an `async fn`: coordinating a call waits on the backend",
                kind.name()
            ),
        ));
    }

    match Stack::build(&layers, &func.sig) {
        Ok(stack) => match errors.into_error() {
            None => generate(&stack, &func),
            Some(err) => fallback::with_errors(err, &func),
        },
        Err(found) => {
            errors.append(found);
            let err = errors
                .into_error()
                .unwrap_or_else(|| syn::Error::new(Span::call_site(), "invalid coord attributes"));
            fallback::with_errors(err, &func)
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

/// True when `tokens` mention `impl`, which cannot be named in the checks we emit.
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

fn millis(krate: &TokenStream, ms: u64) -> TokenStream {
    let ms = Literal::u64_suffixed(ms);
    quote!(#krate::__private::Duration::from_millis(#ms))
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

/// The function with its body replaced by the layered call.
fn generate(stack: &Stack, func: &ItemFn) -> TokenStream {
    let krate = stack.krate.to_token_stream();
    let hidden = Span::mixed_site();
    let call = Ident::new("__coord_call", hidden);
    let key = Ident::new("__coord_key", hidden);
    let fingerprint = Ident::new("__coord_fingerprint", hidden);
    let coordinator = Ident::new("__coord_coordinator", hidden);
    let owned = Ident::new("__coord_owned", hidden);
    let fake_return = Ident::new("__coord_fake_return", hidden);
    let marker = format_ident!("{}", MARKER);
    let op = Ident::new("__COORD_OP", Span::call_site());

    // The return type as written, and where errors about it should point.
    let (ret, ret_span, explicit_ret) = match &func.sig.output {
        ReturnType::Type(_, ty) => (ty.to_token_stream(), ty.span(), true),
        ReturnType::Default => {
            let at = func.sig.paren_token.span.close();
            (quote_spanned!(at=> ()), at, false)
        }
    };
    let nameable_ret = !mentions_impl(ret.clone());
    let krate_at_ret = respan(krate.clone(), ret_span);

    // Checks of the return type, reported at the return type.
    let mut checks = TokenStream::new();
    if nameable_ret {
        if stack.idempotency.is_some() || stack.lock.is_some() {
            checks.extend(quote_spanned! {ret_span=>
                #krate_at_ret::__private::assert_guarded_result::<#ret>();
            });
        }
        if stack.single_flight {
            checks.extend(quote_spanned! {ret_span=>
                #krate_at_ret::__private::assert_shareable_output::<#ret>();
            });
        }
    }

    let name = match &stack.name {
        Some(name) => LitStr::new(name, Span::call_site()).to_token_stream(),
        None => {
            let fn_name = func.sig.ident.unraw().to_string();
            quote!(::core::concat!(::core::module_path!(), "::", #fn_name))
        }
    };
    let idempotency_spec = match &stack.idempotency {
        None => quote!(::core::option::Option::None),
        Some(layer) => {
            let retention = millis(&krate, layer.retention_ms);
            let in_flight_lease = millis(&krate, layer.in_flight_lease_ms);
            let wait = millis(&krate, layer.wait_ms);
            let on_backend_error = policy(&krate, layer.on_backend_error);
            quote! {
                ::core::option::Option::Some(#krate::__private::IdempotencySpec {
                    retention: #retention,
                    in_flight_lease: #in_flight_lease,
                    wait: #wait,
                    on_backend_error: #on_backend_error,
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
            let on_backend_error = policy(&krate, layer.on_backend_error);
            quote! {
                ::core::option::Option::Some(#krate::__private::LockSpec {
                    lease: #lease,
                    wait: #wait,
                    fenced: #fenced,
                    on_backend_error: #on_backend_error,
                })
            }
        }
    };

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
        quote_spanned!(path.span=> .part(#value))
    });
    let fingerprint_stmt = stack.idempotency.as_ref().map(|layer| {
        if layer.fingerprint.is_empty() {
            quote!(let #fingerprint = ::core::option::Option::None;)
        } else {
            let adds = layer.fingerprint.iter().map(|path| {
                let value = borrow_path(path);
                quote_spanned!(path.span=> .add(#value))
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
    let body = &func.block;
    let typed_edge = if explicit_ret && nameable_ret {
        quote_spanned! {ret_span=>
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
        }
    } else {
        TokenStream::new()
    };
    let mut layered = quote!(async move { #typed_edge #body });
    // Innermost first: lock, then single-flight, then idempotency outermost.
    if stack.lock.is_some() {
        layered = quote_spanned!(ret_span=> #krate_at_ret::__private::distributed_lock(#call, #layered));
    }
    if stack.single_flight {
        layered = quote_spanned!(ret_span=> #krate_at_ret::__private::single_flight(#call, #layered));
    }
    if stack.idempotency.is_some() {
        layered = quote_spanned!(ret_span=> #krate_at_ret::__private::idempotent(#call, #fingerprint, #layered));
    }

    let statements = quote! {
        const #marker: () = ();
        #checks
        static #op: #krate::__private::OpSpec = #krate::__private::OpSpec {
            name: #name,
            idempotency: #idempotency_spec,
            lock: #lock_spec,
        };
        #coordinator_stmt
        let #call = #krate::__private::Call::new(&#op, #coordinator, |#key| #key #(#parts)*);
        #fingerprint_stmt
        let #call = &#call;
        #call.run(#layered).await
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
