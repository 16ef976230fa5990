//! Reading parameter paths: `key_from`, `fingerprint` and `key_from_each` (one path or a
//! list), and `transaction` (one parameter by name).

use quote::ToTokens;
use syn::{Expr, Ident, Index, LitStr, Member};

use crate::errors::Errors;
use crate::value::{KeyPath, Setting, as_str_lit, ungrouped};

/// A `key_from` or `fingerprint` value: one path, or a list of them.
pub(crate) fn parse_paths(value: &Expr, option: &str) -> syn::Result<Setting<Vec<KeyPath>>> {
    let elements: Vec<&Expr> = match value {
        Expr::Array(array) => array.elems.iter().map(ungrouped).collect(),
        other => vec![other],
    };
    if elements.is_empty() {
        return Err(syn::Error::new_spanned(
            value,
            format!(
                "`{option}` needs at least one parameter; remove the option instead of giving an empty list"
            ),
        ));
    }
    let mut errors = Errors::default();
    let mut paths: Vec<KeyPath> = Vec::new();
    for element in elements {
        match parse_path(element, option) {
            Ok(path) => {
                if paths.iter().any(|p| p.text() == path.text()) {
                    errors.push(syn::Error::new_spanned(
                        &path.tokens,
                        format!("`{}` is listed twice in `{option}`", path.text()),
                    ));
                } else {
                    paths.push(path);
                }
            }
            Err(err) => errors.push(err),
        }
    }
    if let Some(err) = errors.into_error() {
        return Err(err);
    }
    let canonical = paths
        .iter()
        .map(KeyPath::text)
        .collect::<Vec<_>>()
        .join(", ");
    Ok(Setting::new(paths, value, canonical))
}

/// One parameter of the function, by name (`"tx"` or `tx`): no field of one, no list. Held
/// as a one-path list, so the signature check of `key_from` applies to it as written.
pub(crate) fn parse_parameter(value: &Expr, option: &str) -> syn::Result<Setting<Vec<KeyPath>>> {
    let one = format!("`{option}` takes the name of one parameter, as in `{option} = \"tx\"`");
    if matches!(value, Expr::Array(_)) {
        return Err(syn::Error::new_spanned(value, format!("{one}, not a list")));
    }
    let path = parse_path(value, option).map_err(|_| syn::Error::new_spanned(value, &one))?;
    if !path.members.is_empty() {
        return Err(syn::Error::new_spanned(
            &path.tokens,
            format!(
                "{one}, not a field of one (`{}`): take the transaction as a parameter of its own",
                path.text()
            ),
        ));
    }
    let canonical = path.text();
    Ok(Setting::new(vec![path], value, canonical))
}

fn path_forms(option: &str) -> String {
    format!(
        "`{option}` takes a parameter name (\"tenant_id\"), a field of one (\"order.customer_id\") or a list of them ([\"tenant_id\", \"region\"])"
    )
}

/// One parameter path, written as a string or as bare tokens.
fn parse_path(element: &Expr, option: &str) -> syn::Result<KeyPath> {
    if let Some(lit) = as_str_lit(element) {
        return parse_path_text(lit, option);
    }
    // Bare forms: `tenant_id`, `self`, `order.customer_id`, `pair.0`.
    let mut members = Vec::new();
    let mut at = element;
    loop {
        match at {
            Expr::Field(field) => {
                members.push(field.member.clone());
                at = &field.base;
            }
            Expr::Path(path) if path.qself.is_none() && path.attrs.is_empty() => {
                if let Some(root) = path.path.get_ident() {
                    members.reverse();
                    return Ok(KeyPath {
                        root: root.clone(),
                        members,
                        span: root.span(),
                        tokens: element.to_token_stream(),
                    });
                }
                break;
            }
            _ => break,
        }
    }
    Err(syn::Error::new_spanned(element, path_forms(option)))
}

/// A path written in a string: `"order.customer_id"`. The generated tokens carry the
/// literal's span, so type errors about the parameter point at the string.
fn parse_path_text(lit: &LitStr, option: &str) -> syn::Result<KeyPath> {
    let text = lit.value();
    let span = lit.span();
    let invalid = |why: String| {
        syn::Error::new(
            span,
            format!(
                "\"{text}\" is not a parameter path: {why}; {}",
                path_forms(option)
            ),
        )
    };
    if text.is_empty() {
        return Err(invalid("it is empty".to_owned()));
    }
    let mut segments = text.split('.');
    let first = segments.next().unwrap_or_default();
    let root = if first == "self" {
        Ident::new("self", span)
    } else {
        match syn::parse_str::<Ident>(first) {
            Ok(mut ident) => {
                ident.set_span(span);
                ident
            }
            Err(_) => return Err(invalid(format!("`{first}` is not an identifier"))),
        }
    };
    let mut members = Vec::new();
    for segment in segments {
        if !segment.is_empty() && segment.bytes().all(|b| b.is_ascii_digit()) {
            match segment.parse::<u32>() {
                Ok(index) => members.push(Member::Unnamed(Index { index, span })),
                Err(_) => return Err(invalid(format!("`{segment}` is not a field"))),
            }
            continue;
        }
        match syn::parse_str::<Ident>(segment) {
            Ok(mut ident) => {
                ident.set_span(span);
                members.push(Member::Named(ident));
            }
            Err(_) if segment.is_empty() => {
                return Err(invalid("it has an empty segment".to_owned()));
            }
            Err(_) => return Err(invalid(format!("`{segment}` is not a field name"))),
        }
    }
    Ok(KeyPath {
        root,
        members,
        span,
        tokens: lit.to_token_stream(),
    })
}
