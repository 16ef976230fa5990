//! What a parsed option holds: its typed [`Value`], with where and how it was written
//! ([`Setting`]), and the written forms every parser looks through.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::{Expr, ExprLit, Ident, Lit, LitStr, Member, Path};

/// An option's value, with where it was written.
#[derive(Clone)]
pub(crate) struct Setting<T> {
    pub(crate) value: T,
    /// The value as written, for errors about it.
    pub(crate) tokens: TokenStream,
    /// A normalized rendering, to tell whether two layers were given the same value.
    pub(crate) canonical: String,
}

impl<T> Setting<T> {
    pub(crate) fn new(value: T, written: &Expr, canonical: String) -> Self {
        Setting {
            value,
            tokens: written.to_token_stream(),
            canonical,
        }
    }

    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Setting<U> {
        Setting {
            value: f(self.value),
            tokens: self.tokens,
            canonical: self.canonical,
        }
    }

    /// An error on the value as written.
    pub(crate) fn error(&self, message: impl std::fmt::Display) -> syn::Error {
        syn::Error::new_spanned(&self.tokens, message)
    }
}

/// A parameter, or a field reached from one: `tenant_id`, `order.customer_id`, `self.id`.
#[derive(Clone)]
pub(crate) struct KeyPath {
    /// The parameter.
    pub(crate) root: Ident,
    /// The fields after it.
    pub(crate) members: Vec<Member>,
    /// Where the user wrote it: generated code that uses it carries this span.
    pub(crate) span: Span,
    /// What the user wrote, for errors that cover it.
    pub(crate) tokens: TokenStream,
}

impl KeyPath {
    /// The path as text: `order.customer_id`.
    pub(crate) fn text(&self) -> String {
        let mut text = self.root.unraw().to_string();
        for member in &self.members {
            text.push('.');
            match member {
                Member::Named(ident) => text.push_str(&ident.unraw().to_string()),
                Member::Unnamed(index) => text.push_str(&index.index.to_string()),
            }
        }
        text
    }
}

/// `renew = true | false | "10s"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renew {
    Off,
    /// Every third of the lease.
    Auto,
    Every(u64),
}

/// A parsed option value; which variant an option holds follows from its [`ValueKind`](crate::options::ValueKind).
#[derive(Clone)]
pub(crate) enum Value {
    Millis(u64),
    Count(u64),
    Bool(bool),
    Paths(Vec<KeyPath>),
    /// A word of a [`ValueKind::Choice`](crate::options::ValueKind::Choice), as spelled in the table.
    Word(&'static str),
    Expr(Expr),
    Path(Path),
    Name(String),
    Renew(Renew),
}

/// Looks through the invisible groups a `macro_rules!` macro wraps around the fragments it
/// substitutes (`name = $op` with `$op:literal` arrives as a group holding the literal), so an
/// attribute written by a user's own macro reads like one written by hand.
pub(crate) fn ungrouped(value: &Expr) -> &Expr {
    match value {
        Expr::Group(group) => ungrouped(&group.expr),
        other => other,
    }
}

/// The string literal `value` is, if it is one.
pub(crate) fn as_str_lit(value: &Expr) -> Option<&LitStr> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Some(s),
        _ => None,
    }
}
