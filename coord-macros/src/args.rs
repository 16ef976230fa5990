//! Attribute arguments: `name = value` pairs parsed into a typed model, one per attribute.
//!
//! Parsing goes as far as it can: every option is checked, and every mistake found is
//! reported, not just the first one.

use proc_macro2::{Span, TokenStream};
use quote::ToTokens;
use syn::ext::IdentExt;
use syn::parse::{ParseStream, Parser};
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Ident, Index, Lit, LitStr, Member, Path, Token};

use crate::duration;

/// The three attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Idempotent,
    SingleFlight,
    DistributedLock,
}

/// Options every attribute takes; they describe the call, so layers share them.
const SHARED_OPTIONS: [&str; 4] = ["key_from", "name", "coordinator", "crate"];

impl Kind {
    /// Every kind, in canonical nesting order (outermost first).
    pub(crate) const ALL: [Kind; 3] = [Kind::Idempotent, Kind::SingleFlight, Kind::DistributedLock];

    /// The attribute's name as written.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Idempotent => "idempotent",
            Kind::SingleFlight => "single_flight",
            Kind::DistributedLock => "distributed_lock",
        }
    }

    /// The kind an attribute name stands for.
    pub(crate) fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The options only this attribute takes.
    fn own_options(self) -> &'static [&'static str] {
        match self {
            Kind::Idempotent => &[
                "retention",
                "in_flight_lease",
                "wait",
                "fingerprint",
                "on_backend_error",
                "renew",
                "on_lost",
                "on_abandoned",
                "on_store_error",
                "on_missing_key",
            ],
            Kind::SingleFlight => &[],
            Kind::DistributedLock => &[
                "lease",
                "wait",
                "fenced",
                "on_backend_error",
                "renew",
                "on_lost",
            ],
        }
    }

    /// Every option this attribute takes.
    fn options(self) -> impl Iterator<Item = &'static str> {
        SHARED_OPTIONS
            .into_iter()
            .chain(self.own_options().iter().copied())
    }
}

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

/// What the call does when the coordination backend fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Policy {
    FailClosed,
    FailOpen,
}

/// `renew = true | false | "10s"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Renew {
    Off,
    /// Every third of the lease.
    Auto,
    Every(u64),
}

/// `on_lost = "cancel" | "signal"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lost {
    Cancel,
    Signal,
}

/// `on_abandoned = "rerun" | "fail"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Abandoned {
    Rerun,
    Fail,
}

/// `on_store_error = "error" | "return_ok"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreError {
    Error,
    ReturnOk,
}

/// `on_missing_key = "fail" | "run_unprotected"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MissingKey {
    Fail,
    RunUnprotected,
}

/// One attribute's arguments. Every field is `None` when the option was not given.
pub(crate) struct Args {
    pub(crate) kind: Kind,
    /// The attribute itself, for errors about it as a whole; `None` for the attribute being
    /// expanded, whose location is the macro's call site.
    site: Option<TokenStream>,
    pub(crate) key_from: Option<Setting<Vec<KeyPath>>>,
    pub(crate) name: Option<Setting<String>>,
    pub(crate) coordinator: Option<Setting<Expr>>,
    pub(crate) krate: Option<Setting<Path>>,
    pub(crate) retention: Option<Setting<u64>>,
    pub(crate) in_flight_lease: Option<Setting<u64>>,
    pub(crate) lease: Option<Setting<u64>>,
    pub(crate) wait: Option<Setting<u64>>,
    pub(crate) fenced: Option<Setting<bool>>,
    pub(crate) fingerprint: Option<Setting<Vec<KeyPath>>>,
    pub(crate) on_backend_error: Option<Setting<Policy>>,
    pub(crate) renew: Option<Setting<Renew>>,
    pub(crate) on_lost: Option<Setting<Lost>>,
    pub(crate) on_abandoned: Option<Setting<Abandoned>>,
    pub(crate) on_store_error: Option<Setting<StoreError>>,
    pub(crate) on_missing_key: Option<Setting<MissingKey>>,
}

impl Args {
    fn empty(kind: Kind, site: Option<TokenStream>) -> Args {
        Args {
            kind,
            site,
            key_from: None,
            name: None,
            coordinator: None,
            krate: None,
            retention: None,
            in_flight_lease: None,
            lease: None,
            wait: None,
            fenced: None,
            fingerprint: None,
            on_backend_error: None,
            renew: None,
            on_lost: None,
            on_abandoned: None,
            on_store_error: None,
            on_missing_key: None,
        }
    }

    /// An error pointing at the whole attribute.
    pub(crate) fn error(&self, message: impl std::fmt::Display) -> syn::Error {
        match &self.site {
            Some(tokens) => syn::Error::new_spanned(tokens, message),
            None => syn::Error::new(Span::call_site(), message),
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
                let args = Args::empty(kind, site);
                let mut errors = Errors::default();
                errors.push(syn::Error::new_spanned(
                    nv,
                    format!(
                        "write the options in parentheses: `#[{}(option = value, ...)]`",
                        kind.name()
                    ),
                ));
                (args, errors)
            }
        }
    }

    fn parse(kind: Kind, site: Option<TokenStream>, tokens: TokenStream) -> (Args, Errors) {
        let mut args = Args::empty(kind, site);
        let mut errors = Errors::default();
        let raw = match parse_raw_options.parse2(tokens) {
            Ok(raw) => raw,
            Err(err) => {
                errors.push(err);
                return (args, errors);
            }
        };
        for option in raw {
            match option {
                RawOption::Valued { name, value } => args.apply(&name, &value, &mut errors),
                RawOption::Bare { name } => errors.push(bare_option_error(kind, &name)),
            }
        }
        (args, errors)
    }

    /// Checks one `name = value` and stores it.
    fn apply(&mut self, name: &Ident, value: &Expr, errors: &mut Errors) {
        let option = name.unraw().to_string();
        if !self.kind.options().any(|known| known == option) {
            errors.push(unknown_option_error(self.kind, name, &option));
            return;
        }
        let duplicate = match option.as_str() {
            "key_from" => self.key_from.is_some(),
            "name" => self.name.is_some(),
            "coordinator" => self.coordinator.is_some(),
            "crate" => self.krate.is_some(),
            "retention" => self.retention.is_some(),
            "in_flight_lease" => self.in_flight_lease.is_some(),
            "lease" => self.lease.is_some(),
            "wait" => self.wait.is_some(),
            "fenced" => self.fenced.is_some(),
            "fingerprint" => self.fingerprint.is_some(),
            "on_backend_error" => self.on_backend_error.is_some(),
            "renew" => self.renew.is_some(),
            "on_lost" => self.on_lost.is_some(),
            "on_abandoned" => self.on_abandoned.is_some(),
            "on_store_error" => self.on_store_error.is_some(),
            "on_missing_key" => self.on_missing_key.is_some(),
            _ => false,
        };
        if duplicate {
            errors.push(syn::Error::new_spanned(
                name,
                format!(
                    "`{option}` is given twice in this #[{}]; keep one",
                    self.kind.name()
                ),
            ));
            return;
        }
        let result = match option.as_str() {
            "key_from" => parse_paths(value, "key_from").map(|v| self.key_from = Some(v)),
            "name" => parse_name(value).map(|v| self.name = Some(v)),
            "coordinator" => parse_coordinator(value).map(|v| self.coordinator = Some(v)),
            "crate" => parse_crate(value).map(|v| self.krate = Some(v)),
            "retention" => parse_duration(value, &option, true).map(|v| self.retention = Some(v)),
            "in_flight_lease" => {
                parse_duration(value, &option, true).map(|v| self.in_flight_lease = Some(v))
            }
            "lease" => parse_duration(value, &option, true).map(|v| self.lease = Some(v)),
            "wait" => parse_duration(value, &option, false).map(|v| self.wait = Some(v)),
            "fenced" => parse_bool(value, &option).map(|v| self.fenced = Some(v)),
            "fingerprint" => parse_paths(value, "fingerprint").map(|v| self.fingerprint = Some(v)),
            "on_backend_error" => parse_policy(value).map(|v| self.on_backend_error = Some(v)),
            "renew" => parse_renew(value).map(|v| self.renew = Some(v)),
            "on_lost" => parse_choice(
                value,
                "on_lost",
                &[("cancel", Lost::Cancel), ("signal", Lost::Signal)],
            )
            .map(|v| self.on_lost = Some(v)),
            "on_abandoned" => parse_choice(
                value,
                "on_abandoned",
                &[("rerun", Abandoned::Rerun), ("fail", Abandoned::Fail)],
            )
            .map(|v| self.on_abandoned = Some(v)),
            "on_store_error" => parse_choice(
                value,
                "on_store_error",
                &[
                    ("error", StoreError::Error),
                    ("return_ok", StoreError::ReturnOk),
                ],
            )
            .map(|v| self.on_store_error = Some(v)),
            "on_missing_key" => parse_choice(
                value,
                "on_missing_key",
                &[
                    ("fail", MissingKey::Fail),
                    ("run_unprotected", MissingKey::RunUnprotected),
                ],
            )
            .map(|v| self.on_missing_key = Some(v)),
            _ => Ok(()),
        };
        if let Err(err) = result {
            errors.push(err);
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
    let elsewhere: Vec<String> = Kind::ALL
        .into_iter()
        .filter(|k| *k != kind && k.own_options().contains(&option))
        .map(|k| format!("#[{}]", k.name()))
        .collect();
    if !elsewhere.is_empty() {
        message.push_str(&format!(
            "; `{option}` is an option of {}",
            elsewhere.join(" and ")
        ));
    } else if let Some(close) = closest(option, kind.options()) {
        message.push_str(&format!("; did you mean `{close}`?"));
    }
    message.push_str(&format!(
        "\n#[{}] takes: {}",
        kind.name(),
        list(kind.options())
    ));
    syn::Error::new_spanned(name, message)
}

fn bare_option_error(kind: Kind, name: &Ident) -> syn::Error {
    let option = name.unraw().to_string();
    if !kind.options().any(|known| known == option) {
        return unknown_option_error(kind, name, &option);
    }
    let example = match option.as_str() {
        "key_from" | "fingerprint" => "\"tenant_id\"",
        "name" => "\"payments.charge\"",
        "coordinator" => "self.coordinator",
        "crate" => "\"coord_core\"",
        "fenced" | "renew" => "true",
        "on_backend_error" => "\"fail_closed\"",
        "on_lost" => "\"cancel\"",
        "on_abandoned" => "\"rerun\"",
        "on_store_error" => "\"error\"",
        "on_missing_key" => "\"fail\"",
        _ => "\"30s\"",
    };
    syn::Error::new_spanned(
        name,
        format!("`{option}` needs a value: write `{option} = {example}`"),
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
        Expr::Array(array) => array.elems.iter().collect(),
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
fn parse_name(value: &Expr) -> syn::Result<Setting<String>> {
    let Some(lit) = as_str_lit(value) else {
        return Err(syn::Error::new_spanned(
            value,
            "`name` takes a string, as in `name = \"payments.charge\"`",
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

/// `coordinator = <expr>`, or the expression in a string.
fn parse_coordinator(value: &Expr) -> syn::Result<Setting<Expr>> {
    let expr = match as_str_lit(value) {
        Some(lit) => lit.parse::<Expr>().map_err(|err| {
            syn::Error::new(
                lit.span(),
                format!("`coordinator` holds no expression: {err}"),
            )
        })?,
        None => value.clone(),
    };
    let canonical = expr.to_token_stream().to_string();
    Ok(Setting::new(expr, value, canonical))
}

/// `crate = "path"` (or a bare path): where the runtime crate is.
fn parse_crate(value: &Expr) -> syn::Result<Setting<Path>> {
    let path = match value {
        Expr::Path(path) if path.qself.is_none() && path.attrs.is_empty() => path.path.clone(),
        other => match as_str_lit(other) {
            Some(lit) => lit.parse::<Path>().map_err(|_| {
                syn::Error::new(
                    lit.span(),
                    format!(
                        "\"{}\" is not a path; `crate` names the coord crate as your crate depends on it, such as \"coord\"",
                        lit.value()
                    ),
                )
            })?,
            None => {
                return Err(syn::Error::new_spanned(
                    other,
                    "`crate` takes a path in a string, such as `crate = \"coord\"`",
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
    let millis = duration::parse_millis(&lit.value())
        .map_err(|message| syn::Error::new(lit.span(), message))?;
    if positive && millis == 0 {
        return Err(syn::Error::new(
            lit.span(),
            format!("`{option}` must be longer than zero"),
        ));
    }
    Ok(Setting::new(millis, value, millis.to_string()))
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

/// `on_backend_error = "fail_closed" | "fail_open"` (a bare word is accepted too).
fn parse_policy(value: &Expr) -> syn::Result<Setting<Policy>> {
    const WORDS: [&str; 2] = ["fail_closed", "fail_open"];
    let (word, span) = match value {
        Expr::Path(path) if path.path.get_ident().is_some() => {
            let ident = path.path.get_ident().map(Ident::unraw);
            (
                ident.map(|i| i.to_string()).unwrap_or_default(),
                value.span(),
            )
        }
        other => match as_str_lit(other) {
            Some(lit) => (lit.value(), lit.span()),
            None => {
                return Err(syn::Error::new_spanned(
                    other,
                    "`on_backend_error` takes \"fail_closed\" or \"fail_open\"",
                ));
            }
        },
    };
    let policy = match word.as_str() {
        "fail_closed" => Policy::FailClosed,
        "fail_open" => Policy::FailOpen,
        _ => {
            let mut message =
                format!("`on_backend_error` is \"fail_closed\" or \"fail_open\", not \"{word}\"");
            let close = closest(&word, WORDS).or_else(|| {
                let lower = word.to_ascii_lowercase();
                WORDS.into_iter().find(|w| {
                    w.strip_prefix("fail_")
                        .is_some_and(|tail| lower.contains(tail))
                })
            });
            if let Some(close) = close {
                message.push_str(&format!("; did you mean \"{close}\"?"));
            }
            return Err(syn::Error::new(span, message));
        }
    };
    Ok(Setting::new(policy, value, word))
}

/// `renew = true | false` or `renew = "10s"` (the interval).
fn parse_renew(value: &Expr) -> syn::Result<Setting<Renew>> {
    match value {
        Expr::Lit(ExprLit {
            lit: Lit::Bool(b), ..
        }) => {
            let renew = if b.value { Renew::Auto } else { Renew::Off };
            Ok(Setting::new(renew, value, b.value.to_string()))
        }
        other => match as_str_lit(other) {
            Some(_) => {
                let every = parse_duration(value, "renew", true)?;
                Ok(Setting::new(
                    Renew::Every(every.value),
                    value,
                    every.value.to_string(),
                ))
            }
            None => Err(syn::Error::new_spanned(
                other,
                "`renew` takes `true`, `false`, or an interval such as `renew = \"10s\"`",
            )),
        },
    }
}

/// One word out of a fixed set, quoted or bare, with a suggestion when it is close to one.
fn parse_choice<T: Copy>(
    value: &Expr,
    option: &str,
    choices: &[(&'static str, T)],
) -> syn::Result<Setting<T>> {
    let words: Vec<&str> = choices.iter().map(|(w, _)| *w).collect();
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
    match choices.iter().find(|(w, _)| *w == word) {
        Some((_, choice)) => Ok(Setting::new(*choice, value, word)),
        None => {
            let mut message = format!("`{option}` is {expected}, not \"{word}\"");
            if let Some(close) = closest(&word, words.iter().copied()) {
                message.push_str(&format!("; did you mean \"{close}\"?"));
            }
            Err(syn::Error::new(span, message))
        }
    }
}
