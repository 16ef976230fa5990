//! The function around the layers: the locals the generated code declares, its return type
//! as the place where the layers' bounds are checked, the user's body as the innermost step,
//! and the function put back together around the generated statements.

use proc_macro2::{Delimiter, Group, Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::{AttrStyle, Ident, ItemFn, ReturnType, Signature};

use super::spans::{first_span, respan, with_span};

/// The locals the generated body declares.
///
/// They are declared at the call site (not `mixed_site`) because some uses of them are placed
/// at the user's return type; their `__coord_` prefix keeps them apart from user names. They
/// resolve where the function itself was written: when a user's macro writes the attributes
/// and the function in different expansions, the attribute's call site and the return type
/// belong to different hygiene contexts, and only the function's is shared by every place
/// they are used.
pub(super) struct Locals {
    /// The `Call`: the operation, the coordinator and the key, shared by every layer.
    pub(super) call: Ident,
    /// The key builder the key parts are added to.
    pub(super) key: Ident,
    /// The idempotency layer's fingerprint of the call's parameters.
    pub(super) fingerprint: Ident,
    /// The coordinator the call runs on.
    pub(super) coordinator: Ident,
    /// The owner of a coordinator given as an expression.
    pub(super) owned: Ident,
    /// The never-produced value that tells inference the body's output type.
    pub(super) fake_return: Ident,
}

impl Locals {
    pub(super) fn new(sig: &Signature) -> Locals {
        let hidden = Span::call_site().resolved_at(sig.fn_token.span);
        Locals {
            call: Ident::new("__coord_call", hidden),
            key: Ident::new("__coord_key", hidden),
            fingerprint: Ident::new("__coord_fingerprint", hidden),
            coordinator: Ident::new("__coord_coordinator", hidden),
            owned: Ident::new("__coord_owned", hidden),
            fake_return: Ident::new("__coord_fake_return", hidden),
        }
    }
}

/// Where the layer calls are written: at the return type.
///
/// The layer calls are what check the return type: `GuardedResult` (a `Result` whose error
/// converts from `CoordError`) for idempotency and the lock, `Clone + Send + 'static` for
/// single-flight, the cache's form for the cache. They are placed at the return type's first
/// token (at the `)` closing the parameters when there is none), so an unmet bound is
/// reported there, once.
pub(super) struct ReturnSite {
    /// The span every layer call carries.
    pub(super) at: Span,
    /// The return type, when it can be written as a `let` type (it mentions no `impl`).
    pub(super) typed: Option<TokenStream>,
    /// The runtime crate's path, placed at the return type.
    pub(super) krate: TokenStream,
    /// [`Locals::call`], placed at the return type.
    pub(super) call: Ident,
    /// [`Locals::fingerprint`], placed at the return type.
    pub(super) fingerprint: Ident,
}

impl ReturnSite {
    pub(super) fn new(sig: &Signature, krate: &TokenStream, locals: &Locals) -> ReturnSite {
        let (at, typed) = match &sig.output {
            ReturnType::Type(_, ty) => {
                let ret = ty.to_token_stream();
                (
                    first_span(&ret),
                    (!mentions_impl(ret.clone())).then_some(ret),
                )
            }
            ReturnType::Default => (sig.paren_token.span.close(), None),
        };
        ReturnSite {
            at,
            typed,
            krate: respan(krate.clone(), at),
            call: with_span(&locals.call, at),
            fingerprint: with_span(&locals.fingerprint, at),
        }
    }
}

/// True when `tokens` mention `impl`: such a return type cannot be written as a `let` type.
fn mentions_impl(tokens: TokenStream) -> bool {
    tokens.into_iter().any(|token| match token {
        TokenTree::Ident(ident) => ident == "impl",
        TokenTree::Group(group) => mentions_impl(group.stream()),
        _ => false,
    })
}

/// The innermost step: the user's body, as the future `Call::body` runs.
///
/// The user's block keeps its own scope; a `return` in it leaves this async block. The
/// never-taken branch tells inference the block's output type up front, as the function's
/// signature did for the original body. The braces are re-marked as generated (at the same
/// place), so that lints about a block nested in a block do not fire on the user's body.
pub(super) fn body(func: &ItemFn, site: &ReturnSite, locals: &Locals) -> TokenStream {
    let stmts = &func.block.stmts;
    let mut body = Group::new(Delimiter::Brace, quote!(#(#stmts)*));
    body.set_span(Span::call_site().located_at(func.block.brace_token.span.join()));
    let at = site.at;
    let fake_return = &locals.fake_return;
    let typed_edge = match &site.typed {
        Some(ret) => quote_spanned! {at=>
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
    let call = &site.call;
    quote!(#call.body(async move { #typed_edge #body }))
}

/// The function as written (attributes, visibility, signature), with `statements` as its body
/// after its inner attributes.
pub(super) fn with_statements(func: &ItemFn, statements: TokenStream) -> TokenStream {
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
