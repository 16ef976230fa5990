//! Attribute arguments: `name = value` pairs parsed into a typed model, one per attribute.
//!
//! Which options exist, what each attribute takes and what kind of value each one holds all
//! come from the table in [`crate::options`]; this module only knows how to read each kind of
//! value. Parsing goes as far as it can: every option is checked, and every mistake found is
//! reported, not just the first one.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Ident, Index, Lit, LitStr, Member, Path, Token};

use crate::options::{self, Choice, Kind, OptionSpec, ValueKind};

/// Collects errors so that all of them are reported together.
#[derive(Default)]
pub(crate) struct Errors(Option<syn::Error>);

impl Errors {
    pub(crate) fn push(&mut self, err: syn::Error) {
        match &mut self.0 {
            Some(all) => all.combine(err),
            None => self.0 = Some(err),
        }
    }

    pub(crate) fn append(&mut self, other: Errors) {
        if let Some(err) = other.0 {
            self.push(err);
        }
    }

    pub(crate) fn into_error(self) -> Option<syn::Error> {
        self.0
    }

    /// How many errors were pushed so far.
    pub(crate) fn count(&self) -> usize {
        self.0.as_ref().map_or(0, |all| all.into_iter().count())
    }

    /// All the errors, with `last` after them.
    pub(crate) fn then(self, last: syn::Error) -> syn::Error {
        match self.0 {
            Some(mut all) => {
                all.combine(last);
                all
            }
            None => last,
        }
    }
}

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
    fn new(value: T, written: &Expr, canonical: String) -> Self {
        Setting {
            value,
            tokens: written.to_token_stream(),
            canonical,
        }
    }

    fn map<U>(self, f: impl FnOnce(T) -> U) -> Setting<U> {
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

/// A parsed option value; which variant an option holds follows from its [`ValueKind`].
#[derive(Clone)]
pub(crate) enum Value {
    Millis(u64),
    Count(u64),
    Bool(bool),
    Paths(Vec<KeyPath>),
    /// A word of a [`ValueKind::Choice`], as spelled in the table.
    Word(&'static str),
    Expr(Expr),
    Path(Path),
    Name(String),
    Renew(Renew),
}

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

/// Looks through the invisible groups a `macro_rules!` macro wraps around the fragments it
/// substitutes (`name = $op` with `$op:literal` arrives as a group holding the literal), so an
/// attribute written by a user's own macro reads like one written by hand.
fn ungrouped(value: &Expr) -> &Expr {
    match value {
        Expr::Group(group) => ungrouped(&group.expr),
        other => other,
    }
}

/// Reads `value` with the parser for the option's kind of value.
fn parse_value(spec: &OptionSpec, value: &Expr) -> syn::Result<Setting<Value>> {
    let option = spec.name;
    let value = ungrouped(value);
    Ok(match spec.value {
        ValueKind::Duration { positive } => {
            parse_duration(value, option, positive)?.map(Value::Millis)
        }
        ValueKind::Bool => parse_bool(value, option)?.map(Value::Bool),
        ValueKind::Count { positive } => parse_count(value, option, positive)?.map(Value::Count),
        ValueKind::Permits => parse_permits(value, option)?.map(Value::Count),
        ValueKind::KeyPaths => parse_paths(value, option)?.map(Value::Paths),
        ValueKind::Choice(words) => parse_choice(value, option, words)?.map(Value::Word),
        ValueKind::Expr => parse_coordinator(value, option)?.map(Value::Expr),
        ValueKind::CratePath => parse_crate(value, option)?.map(Value::Path),
        ValueKind::OperationName => parse_name(value, option)?.map(Value::Name),
        ValueKind::Renew => parse_renew(value, option)?.map(Value::Renew),
        ValueKind::ProfileName => parse_profile(value, option)?.map(Value::Name),
        ValueKind::Parameter => parse_parameter(value, option)?.map(Value::Paths),
    })
}

/// Reads a default from the table as if the user had written it.
pub(crate) fn parse_default(spec: &OptionSpec, default: &str) -> syn::Result<Setting<Value>> {
    let value: Expr = syn::parse_str(default)?;
    parse_value(spec, &value)
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

/// The closest name in `candidates`, if one is close enough to be a likely typo.
pub(crate) fn closest<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(word, c), c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

/// Renders names as a list: `a`, `b`, `c`.
pub(crate) fn list(names: impl IntoIterator<Item = impl std::fmt::Display>) -> String {
    names
        .into_iter()
        .map(|n| format!("`{n}`"))
        .collect::<Vec<_>>()
        .join(", ")
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

fn as_str_lit(value: &Expr) -> Option<&LitStr> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Str(s), ..
        }) => Some(s),
        _ => None,
    }
}

/// A `key_from` or `fingerprint` value: one path, or a list of them.
fn parse_paths(value: &Expr, option: &str) -> syn::Result<Setting<Vec<KeyPath>>> {
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
fn parse_parameter(value: &Expr, option: &str) -> syn::Result<Setting<Vec<KeyPath>>> {
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

/// An operation name: non-empty, ASCII letters, digits and `. _ - /`.
fn parse_name(value: &Expr, option: &str) -> syn::Result<Setting<String>> {
    let Some(lit) = as_str_lit(value) else {
        return Err(syn::Error::new_spanned(
            value,
            format!("`{option}` takes a string, as in `{option} = \"payments.charge\"`"),
        ));
    };
    let name = lit.value();
    let allowed = "a name may hold only ASCII letters and digits, `.`, `_`, `-` and `/`";
    if name.is_empty() {
        return Err(syn::Error::new(
            lit.span(),
            format!("the operation name is empty; {allowed}"),
        ));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/')))
    {
        return Err(syn::Error::new(
            lit.span(),
            format!("invalid operation name \"{name}\": {allowed}, not {bad:?}"),
        ));
    }
    Ok(Setting::new(name.clone(), value, name))
}

/// `profile = "name"`: lowercase ASCII letters, digits and `_`, starting with a letter, as
/// the configuration (and its `COORD_PROFILE_<NAME>_*` variables) spells profile names.
fn parse_profile(value: &Expr, option: &str) -> syn::Result<Setting<String>> {
    let Some(lit) = as_str_lit(value) else {
        return Err(syn::Error::new_spanned(
            value,
            format!(
                "`{option}` takes a string, the name of a configured profile, as in `{option} = \"payments\"`"
            ),
        ));
    };
    let name = lit.value();
    let allowed =
        "a profile name is lowercase ASCII letters, digits and `_`, starting with a letter";
    if name.is_empty() {
        return Err(syn::Error::new(
            lit.span(),
            format!("the profile name is empty; {allowed}"),
        ));
    }
    let starts_with_letter = name.starts_with(|c: char| c.is_ascii_lowercase());
    let bad = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_'));
    if let Some(bad) = bad {
        return Err(syn::Error::new(
            lit.span(),
            format!("invalid profile name \"{name}\": {allowed}, not {bad:?}"),
        ));
    }
    if !starts_with_letter {
        return Err(syn::Error::new(
            lit.span(),
            format!("invalid profile name \"{name}\": {allowed}"),
        ));
    }
    Ok(Setting::new(name.clone(), value, name))
}

/// `coordinator = <expr>`, or the expression in a string.
fn parse_coordinator(value: &Expr, option: &str) -> syn::Result<Setting<Expr>> {
    let expr = match as_str_lit(value) {
        Some(lit) => lit.parse::<Expr>().map_err(|err| {
            syn::Error::new(lit.span(), format!("`{option}` holds no expression: {err}"))
        })?,
        None => value.clone(),
    };
    let canonical = expr.to_token_stream().to_string();
    Ok(Setting::new(expr, value, canonical))
}

/// `crate = "path"` (or a bare path): where the runtime crate is.
fn parse_crate(value: &Expr, option: &str) -> syn::Result<Setting<Path>> {
    let path = match value {
        Expr::Path(path) if path.qself.is_none() && path.attrs.is_empty() => path.path.clone(),
        other => match as_str_lit(other) {
            Some(lit) => lit.parse::<Path>().map_err(|_| {
                syn::Error::new(
                    lit.span(),
                    format!(
                        "\"{}\" is not a path; `{option}` names the coord crate as your crate depends on it, such as \"coord\"",
                        lit.value()
                    ),
                )
            })?,
            None => {
                return Err(syn::Error::new_spanned(
                    other,
                    format!("`{option}` takes a path in a string, such as `{option} = \"coord\"`"),
                ));
            }
        },
    };
    let canonical = path.to_token_stream().to_string();
    Ok(Setting::new(path, value, canonical))
}

fn parse_duration(value: &Expr, option: &str, positive: bool) -> syn::Result<Setting<u64>> {
    let Some(lit) = as_str_lit(value) else {
        return Err(syn::Error::new_spanned(
            value,
            format!("`{option}` takes a duration in a string, such as `{option} = \"30s\"`"),
        ));
    };
    let millis = coord_duration::parse_millis(&lit.value())
        .map_err(|message| syn::Error::new(lit.span(), message))?;
    if positive && millis == 0 {
        return Err(syn::Error::new(
            lit.span(),
            format!("`{option}` must be longer than zero"),
        ));
    }
    Ok(Setting::new(millis, value, millis.to_string()))
}

/// A whole number: an integer literal (`10_000`) or one in a string (`"10000"`).
fn parse_count(value: &Expr, option: &str, positive: bool) -> syn::Result<Setting<u64>> {
    let parsed = match value {
        Expr::Lit(ExprLit {
            lit: Lit::Int(int), ..
        }) if int.suffix().is_empty() || int.suffix() == "u64" => int.base10_parse::<u64>().ok(),
        other => as_str_lit(other).and_then(|lit| lit.value().replace('_', "").parse::<u64>().ok()),
    };
    match parsed {
        Some(0) if positive => Err(syn::Error::new_spanned(
            value,
            format!("`{option}` must be more than zero"),
        )),
        Some(n) => Ok(Setting::new(n, value, n.to_string())),
        None => Err(syn::Error::new_spanned(
            value,
            format!("`{option}` takes a whole number, such as `{option} = 10_000`"),
        )),
    }
}

/// A bare integer literal of at least 1 that fits a `u32`: a number of semaphore permits.
fn parse_permits(value: &Expr, option: &str) -> syn::Result<Setting<u64>> {
    let Expr::Lit(ExprLit {
        lit: Lit::Int(int), ..
    }) = value
    else {
        return Err(syn::Error::new_spanned(
            value,
            format!(
                "`{option}` takes a whole number of at least 1, written as a number: `{option} = 5`"
            ),
        ));
    };
    let parsed = match int.suffix() {
        "" | "u32" => int.base10_parse::<u32>().ok(),
        _ => None,
    };
    match parsed {
        Some(0) => Err(syn::Error::new_spanned(
            value,
            format!(
                "`{option} = 0` lets no call in: a semaphore needs at least 1 permit (`{option} = 1` is one holder at a time)"
            ),
        )),
        Some(n) => Ok(Setting::new(u64::from(n), value, n.to_string())),
        None => Err(syn::Error::new_spanned(
            value,
            format!("`{option}` takes a whole number from 1 to {}", u32::MAX),
        )),
    }
}

fn parse_bool(value: &Expr, option: &str) -> syn::Result<Setting<bool>> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(b), ..
        }) => Ok(Setting::new(b.value, value, b.value.to_string())),
        other => Err(syn::Error::new_spanned(
            other,
            format!("`{option}` takes `true` or `false`"),
        )),
    }
}

/// `renew = true | false` or `renew = "10s"` (the interval).
fn parse_renew(value: &Expr, option: &str) -> syn::Result<Setting<Renew>> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(b), ..
        }) => {
            let renew = if b.value { Renew::Auto } else { Renew::Off };
            Ok(Setting::new(renew, value, b.value.to_string()))
        }
        other => match as_str_lit(other) {
            Some(_) => {
                let every = parse_duration(value, option, true)?;
                Ok(Setting::new(
                    Renew::Every(every.value),
                    value,
                    every.value.to_string(),
                ))
            }
            None => Err(syn::Error::new_spanned(
                other,
                format!(
                    "`{option}` takes `true`, `false`, or an interval such as `{option} = \"10s\"`"
                ),
            )),
        },
    }
}

/// One word out of a fixed set, quoted or bare: the parser of every word-valued option.
///
/// A near miss gets a suggestion: a word close in spelling, or else the one word whose
/// distinctive part the written word contains (`"open"` for `"fail_open"`).
fn parse_choice(
    value: &Expr,
    option: &str,
    words: &'static [&'static str],
) -> syn::Result<Setting<&'static str>> {
    let expected = words
        .iter()
        .map(|w| format!("\"{w}\""))
        .collect::<Vec<_>>()
        .join(" or ");
    let (word, span) = match value {
        Expr::Path(path) if path.path.get_ident().is_some() => (
            path.path
                .get_ident()
                .map(|i| i.unraw().to_string())
                .unwrap_or_default(),
            value.span(),
        ),
        other => match as_str_lit(other) {
            Some(lit) => (lit.value(), lit.span()),
            None => {
                return Err(syn::Error::new_spanned(
                    other,
                    format!("`{option}` takes {expected}"),
                ));
            }
        },
    };
    match words.iter().find(|w| **w == word) {
        Some(known) => Ok(Setting::new(*known, value, word)),
        None => {
            let mut message = format!("`{option}` is {expected}, not \"{word}\"");
            let close =
                closest(&word, words.iter().copied()).or_else(|| by_distinctive_part(&word, words));
            if let Some(close) = close {
                message.push_str(&format!("; did you mean \"{close}\"?"));
            }
            Err(syn::Error::new(span, message))
        }
    }
}

/// The one word of `words` that has an `_`-separated part (of four letters or more, so short
/// parts do not match by accident) found in no other word and contained in `written`.
fn by_distinctive_part(written: &str, words: &[&'static str]) -> Option<&'static str> {
    let written = written.to_ascii_lowercase();
    let distinctive = |word: &str| {
        word.split('_')
            .filter(|part| part.len() >= 4)
            .filter(|part| {
                words
                    .iter()
                    .filter(|other| other.split('_').any(|p| p == *part))
                    .count()
                    == 1
            })
            .any(|part| written.contains(part))
    };
    let mut matching = words.iter().copied().filter(|word| distinctive(word));
    match (matching.next(), matching.next()) {
        (Some(word), None) => Some(word),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choose(written: &str, words: &'static [&'static str]) -> Result<&'static str, String> {
        let value: Expr = syn::parse_str(written).expect("test value parses");
        parse_choice(&value, "option", words)
            .map(|setting| setting.value)
            .map_err(|err| err.to_string())
    }

    fn duration(written: &str, positive: bool) -> Result<u64, String> {
        let value: Expr = syn::parse_str(written).expect("test value parses");
        parse_duration(&value, "lease", positive)
            .map(|setting| setting.value)
            .map_err(|err| err.to_string())
    }

    /// The attribute shows the shared grammar's refusal word for word (the same sentence the
    /// configuration shows), and adds only what is about the option: a value that is not a
    /// string, and zero where the option needs a positive duration.
    #[test]
    fn durations_are_the_shared_grammar_plus_the_options_own_rules() {
        for text in [
            "5 minutes",
            "soon",
            "1.5s",
            "5",
            "30s1m",
            "9223372036854775808ms",
        ] {
            let shared = coord_duration::parse_millis(text)
                .expect_err(text)
                .to_string();
            assert_eq!(duration(&format!("{text:?}"), false), Err(shared), "{text}");
        }
        assert_eq!(duration("\"1m30s\"", true), Ok(90_000));
        assert_eq!(duration("\"0s\"", false), Ok(0));
        assert_eq!(
            duration("\"0s\"", true),
            Err("`lease` must be longer than zero".to_owned())
        );
        assert_eq!(
            duration("30", true),
            Err("`lease` takes a duration in a string, such as `lease = \"30s\"`".to_owned())
        );
    }

    const POLICY: &[&str] = &["fail_closed", "fail_open"];
    const STORE: &[&str] = &["error", "return_ok"];

    #[test]
    fn a_choice_is_read_quoted_or_bare() {
        assert_eq!(choose("\"fail_open\"", POLICY), Ok("fail_open"));
        assert_eq!(choose("fail_closed", POLICY), Ok("fail_closed"));
        assert_eq!(choose("r#return_ok", STORE), Ok("return_ok"));
    }

    #[test]
    fn a_near_miss_is_suggested_by_spelling_or_by_its_distinctive_part() {
        let err = choose("\"fail-open\"", POLICY).unwrap_err();
        assert!(err.ends_with("did you mean \"fail_open\"?"), "{err}");
        let err = choose("\"OPEN\"", POLICY).unwrap_err();
        assert!(err.ends_with("did you mean \"fail_open\"?"), "{err}");
        let err = choose("\"return\"", STORE).unwrap_err();
        assert!(err.ends_with("did you mean \"return_ok\"?"), "{err}");
    }

    #[test]
    fn no_suggestion_when_nothing_is_close_or_the_parts_are_ambiguous() {
        // "ok" is too short to count as a distinctive part.
        for (written, words) in [("\"ok\"", STORE), ("\"skip\"", STORE)] {
            let err = choose(written, words).unwrap_err();
            assert!(!err.contains("did you mean"), "{written}: {err}");
        }
        assert_eq!(by_distinctive_part("open_or_closed", POLICY), None);
        assert_eq!(by_distinctive_part("closed", POLICY), Some("fail_closed"));
        let err = choose("3", STORE).unwrap_err();
        assert_eq!(err, "`option` takes \"error\" or \"return_ok\"");
    }
}
