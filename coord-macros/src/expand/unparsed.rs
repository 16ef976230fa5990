//! Input that does not parse as a function with a body: an item being typed in an editor, or
//! not a function at all. The errors are reported where they are and the item comes back out
//! as written, so the compiler and the editor still see it.

use proc_macro2::{Delimiter, Group, TokenStream, TokenTree};
use quote::quote;
use syn::parse::{ParseStream, Parser};
use syn::{Attribute, Signature, Visibility};

use super::{build, take_in};
use crate::args::Args;
use crate::fallback;
use crate::options::Kind;

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
pub(super) fn expand(
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
