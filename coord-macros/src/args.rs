//! Attribute arguments: `name = value` pairs parsed into a typed model, one per attribute.
//!
//! Which options exist, what each attribute takes and what kind of value each one holds all
//! come from the table in [`crate::options`]; this module checks each `name = value` written on
//! an attribute against that table, fills in the table's defaults and gives the model typed
//! getters. Reading each kind of value is [`crate::parse_value`]'s. Parsing goes as far as it
//! can: every option is checked, and every mistake found is reported, not just the first one.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::{Expr, Ident, Token};

use crate::errors::Errors;
use crate::options::{self, Choice, Kind, OptionSpec};
use crate::parse_value::{parse_default, parse_value};
use crate::suggest::{closest, list};
use crate::value::{KeyPath, Renew, Setting, Value};

/// One option's value in an [`Args`].
struct Entry {
    spec: &'static OptionSpec,
    setting: Setting<Value>,
    /// False for a default filled in from the table.
    written: bool,
}

/// One attribute's arguments: the options written on it, and the table's defaults for the
/// options it takes that were not written.
pub(crate) struct Args {
    pub(crate) kind: Kind,
    /// The attribute itself, for errors about it as a whole; `None` for the attribute being
    /// expanded, whose location is the macro's call site.
    site: Option<TokenStream>,
    entries: Vec<Entry>,
    /// Options written on this attribute, whether or not their value parsed.
    attempted: Vec<&'static str>,
}

impl Args {
    fn empty(kind: Kind, site: Option<TokenStream>) -> Args {
        Args {
            kind,
            site,
            entries: Vec::new(),
            attempted: Vec::new(),
        }
    }

    /// An error pointing at the whole attribute.
    pub(crate) fn error(&self, message: impl std::fmt::Display) -> syn::Error {
        match &self.site {
            Some(tokens) => syn::Error::new_spanned(tokens, message),
            None => syn::Error::new(Span::call_site(), message),
        }
    }

    /// The option as written on this attribute; `None` when it was not written.
    pub(crate) fn written(&self, spec: &OptionSpec) -> Option<&Setting<Value>> {
        self.entries
            .iter()
            .find(|e| e.written && e.spec.name == spec.name)
            .map(|e| &e.setting)
    }

    /// Whether the option was written on this attribute, even with a value that was rejected
    /// (so that a missing-option error does not repeat the value's own error).
    pub(crate) fn was_written(&self, spec: &OptionSpec) -> bool {
        self.attempted.contains(&spec.name)
    }

    /// The option as written, or else the table's default for it.
    pub(crate) fn get(&self, spec: &OptionSpec) -> Option<&Setting<Value>> {
        self.written(spec).or_else(|| {
            self.entries
                .iter()
                .find(|e| !e.written && e.spec.name == spec.name)
                .map(|e| &e.setting)
        })
    }

    /// A duration option, in milliseconds.
    pub(crate) fn millis(&self, spec: &OptionSpec) -> Option<u64> {
        match self.get(spec)?.value {
            Value::Millis(ms) => Some(ms),
            _ => None,
        }
    }

    /// A whole-number option.
    pub(crate) fn count(&self, spec: &OptionSpec) -> Option<u64> {
        match self.get(spec)?.value {
            Value::Count(n) => Some(n),
            _ => None,
        }
    }

    /// A `true`/`false` option.
    pub(crate) fn flag(&self, spec: &OptionSpec) -> Option<bool> {
        match self.get(spec)?.value {
            Value::Bool(flag) => Some(flag),
            _ => None,
        }
    }

    /// A word-valued option, as the enum its words stand for.
    pub(crate) fn choice<C: Choice>(&self, spec: &OptionSpec) -> Option<C> {
        match self.get(spec)?.value {
            Value::Word(word) => C::from_word(word),
            _ => None,
        }
    }

    /// A key-path option.
    pub(crate) fn paths(&self, spec: &OptionSpec) -> Option<&[KeyPath]> {
        match &self.get(spec)?.value {
            Value::Paths(paths) => Some(paths),
            _ => None,
        }
    }

    /// `renew`, with the setting, for errors that point at it.
    pub(crate) fn renew(&self, spec: &OptionSpec) -> Option<(Renew, &Setting<Value>)> {
        let setting = self.get(spec)?;
        match setting.value {
            Value::Renew(renew) => Some((renew, setting)),
            _ => None,
        }
    }

    /// Parses the arguments of the attribute being expanded.
    pub(crate) fn parse_primary(kind: Kind, tokens: TokenStream) -> (Args, Errors) {
        Args::parse(kind, None, tokens)
    }

    /// Parses the arguments of a sibling attribute of ours found on the same function.
    pub(crate) fn parse_sibling(kind: Kind, attr: &syn::Attribute) -> (Args, Errors) {
        let site = Some(attr.to_token_stream());
        match &attr.meta {
            syn::Meta::Path(_) => Args::parse(kind, site, TokenStream::new()),
            syn::Meta::List(list) => Args::parse(kind, site, list.tokens.clone()),
            syn::Meta::NameValue(nv) => {
                let mut args = Args::empty(kind, site);
                let mut errors = Errors::default();
                errors.push(syn::Error::new_spanned(
                    nv,
                    format!(
                        "write the options in parentheses: `#[{}(option = value, ...)]`",
                        kind.name()
                    ),
                ));
                args.fill_defaults(&mut errors);
                (args, errors)
            }
        }
    }

    fn parse(kind: Kind, site: Option<TokenStream>, tokens: TokenStream) -> (Args, Errors) {
        let mut args = Args::empty(kind, site);
        let mut errors = Errors::default();
        match parse_raw_options.parse2(tokens) {
            Ok(raw) => {
                for option in raw {
                    match option {
                        RawOption::Valued { name, value } => args.apply(&name, &value, &mut errors),
                        RawOption::Bare { name } => errors.push(bare_option_error(kind, &name)),
                    }
                }
            }
            Err(err) => errors.push(err),
        }
        args.fill_defaults(&mut errors);
        (args, errors)
    }

    /// Checks one `name = value` against the table and stores it.
    fn apply(&mut self, name: &Ident, value: &Expr, errors: &mut Errors) {
        let option = name.unraw().to_string();
        let Some(spec) = options::lookup_for(&option, self.kind) else {
            errors.push(unknown_option_error(self.kind, name, &option));
            return;
        };
        if self.written(spec).is_some() {
            errors.push(syn::Error::new_spanned(
                name,
                format!(
                    "`{option}` is given twice in this #[{}]; keep one",
                    self.kind.name()
                ),
            ));
            return;
        }
        self.attempted.push(spec.name);
        match parse_value(spec, value) {
            Ok(setting) => self.entries.push(Entry {
                spec,
                setting,
                written: true,
            }),
            Err(err) => errors.push(err),
        }
    }

    /// Adds the table's default for every option of this attribute that was not written. The
    /// defaults go through the same parsers as written values, so they cannot drift from what
    /// a user may write; one that does not parse is reported rather than silently replaced.
    fn fill_defaults(&mut self, errors: &mut Errors) {
        for spec in self.kind.options() {
            let Some(default) = spec.default else {
                continue;
            };
            if self.written(spec).is_some() {
                continue;
            }
            match parse_default(spec, default) {
                Ok(setting) => self.entries.push(Entry {
                    spec,
                    setting,
                    written: false,
                }),
                Err(err) => errors.push(syn::Error::new(
                    Span::call_site(),
                    format!(
                        "coord-macros bug: the default of `{}` does not parse: {err}",
                        spec.name
                    ),
                )),
            }
        }
    }
}

/// One option as written, before its value is interpreted.
enum RawOption {
    Valued {
        name: Ident,
        value: Expr,
    },
    /// A name with no `= value` after it; the tokens up to the next comma are skipped.
    Bare {
        name: Ident,
    },
}

fn parse_raw_options(input: ParseStream<'_>) -> syn::Result<Vec<RawOption>> {
    let mut options = Vec::new();
    while !input.is_empty() {
        // `crate` is a keyword, hence `parse_any`.
        let name = if input.peek(Ident::peek_any) {
            input.call(Ident::parse_any)?
        } else {
            return Err(input.error("expected an option name, as in `key_from = \"tenant_id\"`"));
        };
        if input.peek(Token![=]) {
            input.parse::<Token![=]>()?;
            let value: Expr = input.parse()?;
            options.push(RawOption::Valued { name, value });
        } else {
            // Skip whatever stands in place of `= value` so the other options still get checked.
            while !input.is_empty() && !input.peek(Token![,]) {
                input.parse::<proc_macro2::TokenTree>()?;
            }
            options.push(RawOption::Bare { name });
        }
        if input.is_empty() {
            break;
        }
        input.parse::<Token![,]>()?;
    }
    Ok(options)
}

fn unknown_option_error(kind: Kind, name: &Ident, option: &str) -> syn::Error {
    let mut message = format!("unknown option `{option}` for #[{}]", kind.name());
    let names = || kind.options().map(|spec| spec.name);
    let elsewhere: Vec<String> = options::attributes_taking(option)
        .into_iter()
        .filter(|k| *k != kind)
        .map(|k| format!("#[{}]", k.name()))
        .collect();
    if !elsewhere.is_empty() {
        message.push_str(&format!(
            "; `{option}` is an option of {}",
            elsewhere.join(" and ")
        ));
    } else if let Some(close) = closest(option, names()) {
        message.push_str(&format!("; did you mean `{close}`?"));
    }
    message.push_str(&format!("\n#[{}] takes: {}", kind.name(), list(names())));
    syn::Error::new_spanned(name, message)
}

fn bare_option_error(kind: Kind, name: &Ident) -> syn::Error {
    let option = name.unraw().to_string();
    let Some(spec) = options::lookup_for(&option, kind) else {
        return unknown_option_error(kind, name, &option);
    };
    syn::Error::new_spanned(
        name,
        format!(
            "`{option}` needs a value: write `{option} = {}` ({})",
            spec.example, spec.doc
        ),
    )
}
