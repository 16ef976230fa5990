//! Reading one option's value: the parser for each [`ValueKind`], and the table's defaults
//! read through the same parsers as written values.

use quote::ToTokens;
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Expr, ExprLit, Lit, Path};

use crate::options::{OptionSpec, ValueKind};
use crate::parse_key_paths::{parse_parameter, parse_paths};
use crate::suggest::{by_distinctive_part, closest};
use crate::value::{Renew, Setting, Value, as_str_lit, ungrouped};

/// Reads `value` with the parser for the option's kind of value.
pub(crate) fn parse_value(spec: &OptionSpec, value: &Expr) -> syn::Result<Setting<Value>> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::OPTIONS;

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

    /// The value a parsed option holds must be the one its kind of value promises, or the
    /// typed getters the model reads would see nothing.
    fn holds_its_kind(spec: &OptionSpec, value: &Value) -> bool {
        matches!(
            (spec.value, value),
            (ValueKind::Duration { .. }, Value::Millis(_))
                | (ValueKind::Bool, Value::Bool(_))
                | (ValueKind::Count { .. }, Value::Count(_))
                | (ValueKind::Permits, Value::Count(_))
                | (ValueKind::KeyPaths, Value::Paths(_))
                | (ValueKind::Choice(_), Value::Word(_))
                | (ValueKind::Expr, Value::Expr(_))
                | (ValueKind::CratePath, Value::Path(_))
                | (ValueKind::OperationName, Value::Name(_))
                | (ValueKind::Renew, Value::Renew(_))
                | (ValueKind::ProfileName, Value::Name(_))
                | (ValueKind::Parameter, Value::Paths(_))
        )
    }

    #[test]
    fn every_example_and_default_parses_as_its_own_kind_of_value() {
        for spec in OPTIONS {
            for written in std::iter::once(spec.example).chain(spec.default) {
                let setting = parse_default(spec, written)
                    .unwrap_or_else(|err| panic!("`{} = {written}`: {err}", spec.name));
                assert!(
                    holds_its_kind(spec, &setting.value),
                    "`{} = {written}` parsed to another kind of value",
                    spec.name
                );
            }
        }
    }
}
