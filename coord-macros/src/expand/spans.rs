//! Moving generated tokens to where the user wrote something, so that the compiler's errors
//! about them point there.

use proc_macro2::{Group, Span, TokenStream, TokenTree};
use syn::Ident;

/// `tokens` with every token moved to `span`, so errors about them land there.
pub(super) fn respan(tokens: TokenStream, span: Span) -> TokenStream {
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
pub(super) fn first_span(tokens: &TokenStream) -> Span {
    tokens
        .clone()
        .into_iter()
        .next()
        .map_or_else(Span::call_site, |token| match token {
            TokenTree::Group(group) => group.span_open(),
            other => other.span(),
        })
}

/// `ident`, placed at `span`.
pub(super) fn with_span(ident: &Ident, span: Span) -> Ident {
    let mut placed = ident.clone();
    placed.set_span(span);
    placed
}
