//! The validated model of one function's coord attributes: which layers it has, and the key,
//! name, coordinator and crate path they share.

use syn::ext::IdentExt;
use syn::{Expr, FnArg, Ident, Pat, Path, Signature};

use crate::args::{
    self, Abandoned, Args, Errors, KeyPath, Kind, Lost, MissingKey, Policy, Renew, Setting,
    StoreError,
};

/// The `#[idempotent]` layer.
pub(crate) struct IdempotencyLayer {
    pub(crate) retention_ms: u64,
    pub(crate) in_flight_lease_ms: u64,
    pub(crate) wait_ms: u64,
    pub(crate) fingerprint: Vec<KeyPath>,
    pub(crate) on_backend_error: Option<Policy>,
    pub(crate) lease_policy: LeasePolicy,
    pub(crate) on_abandoned: Abandoned,
    pub(crate) on_store_error: StoreError,
    pub(crate) on_missing_key: MissingKey,
}

/// Renewal and loss handling of one lease (a lock, or an in-flight marker).
pub(crate) struct LeasePolicy {
    /// Renew every this many milliseconds; `None`: no renewal.
    pub(crate) renew_ms: Option<u64>,
    /// What happens to the body when the lease is lost; `None`: nothing (the release warns).
    pub(crate) on_lost: Option<Lost>,
}

/// The `#[distributed_lock]` layer.
pub(crate) struct LockLayer {
    pub(crate) lease_ms: u64,
    pub(crate) wait_ms: u64,
    pub(crate) fenced: bool,
    pub(crate) on_backend_error: Option<Policy>,
    pub(crate) lease_policy: LeasePolicy,
}

/// Everything code generation needs, checked.
pub(crate) struct Stack {
    pub(crate) idempotency: Option<IdempotencyLayer>,
    pub(crate) single_flight: bool,
    pub(crate) lock: Option<LockLayer>,
    /// The key parts, in order. Empty: the key is the operation name alone.
    pub(crate) key: Vec<KeyPath>,
    /// `name = ".."`; `None` means the module path and the fn name.
    pub(crate) name: Option<String>,
    pub(crate) coordinator: Option<Expr>,
    pub(crate) krate: Path,
}

const DEFAULT_RETENTION_MS: u64 = 24 * 60 * 60 * 1000;
const DEFAULT_IN_FLIGHT_LEASE_MS: u64 = 30 * 1000;
const DEFAULT_LEASE_MS: u64 = 30 * 1000;

/// Picks the one value of a shared option across layers. A later layer that gives a different
/// value gets an error naming the layer that gave the first one.
fn shared<'a, T>(
    layers: &'a [Args],
    option: &str,
    get: impl Fn(&'a Args) -> Option<&'a Setting<T>>,
    errors: &mut Errors,
) -> Option<&'a Setting<T>> {
    let mut first: Option<(&Setting<T>, Kind)> = None;
    for layer in layers {
        let Some(setting) = get(layer) else { continue };
        match first {
            None => first = Some((setting, layer.kind)),
            Some((chosen, by)) if chosen.canonical != setting.canonical => {
                let what = if option == "key_from" {
                    "the layers share one key".to_owned()
                } else {
                    format!("the layers share one `{option}`")
                };
                errors.push(setting.error(format!(
                    "{what}; this `{option}` differs from the one given on #[{}]; give it once, or the same on every attribute",
                    by.name()
                )));
            }
            Some(_) => {}
        }
    }
    first.map(|(setting, _)| setting)
}

/// The parameters a key or fingerprint can name: `self` and plain identifier patterns.
fn named_parameters(sig: &Signature) -> Vec<Ident> {
    sig.inputs
        .iter()
        .filter_map(|input| match input {
            FnArg::Receiver(receiver) => Some(Ident::new("self", receiver.self_token.span)),
            FnArg::Typed(typed) => match &*typed.pat {
                Pat::Ident(pat) => Some(pat.ident.clone()),
                _ => None,
            },
        })
        .collect()
}

/// Checks that every path starts at a parameter of the function.
fn check_paths(paths: &[KeyPath], option: &str, sig: &Signature, errors: &mut Errors) {
    let params = named_parameters(sig);
    let names: Vec<String> = params.iter().map(|p| p.unraw().to_string()).collect();
    for path in paths {
        let root = path.root.unraw().to_string();
        if names.contains(&root) {
            continue;
        }
        let fn_name = sig.ident.unraw();
        let mut message = if path.members.is_empty() {
            format!("`{option}` names `{root}`, which is not a parameter of `{fn_name}`")
        } else {
            format!(
                "`{option}` path `{}` starts at `{root}`, which is not a parameter of `{fn_name}`",
                path.text()
            )
        };
        if let Some(close) = args::closest(&root, names.iter().map(String::as_str)) {
            message.push_str(&format!("; did you mean `{close}`?"));
        }
        if names.is_empty() {
            message.push_str(&format!("\n`{fn_name}` has no parameter that can be named"));
        } else {
            message.push_str(&format!("\nparameters: {}", args::list(&names)));
        }
        if sig.inputs.len() > params.len() {
            message.push_str(
                "\n(a parameter bound by a pattern such as `(a, b): (u8, u8)` cannot be named; bind it to a name first)",
            );
        }
        errors.push(syn::Error::new_spanned(&path.tokens, message));
    }
}

impl Stack {
    /// Whether the stack has the layer `kind`.
    pub(crate) fn has(&self, kind: Kind) -> bool {
        match kind {
            Kind::Idempotent => self.idempotency.is_some(),
            Kind::SingleFlight => self.single_flight,
            Kind::DistributedLock => self.lock.is_some(),
        }
    }

    /// Merges the attributes found on one function (in source order) into one stack.
    pub(crate) fn build(layers: &[Args], sig: &Signature) -> Result<Stack, Errors> {
        let mut errors = Errors::default();

        // One attribute of each kind.
        let mut seen: Vec<Kind> = Vec::new();
        for layer in layers {
            if seen.contains(&layer.kind) {
                errors.push(layer.error(format!(
                    "#[{0}] is given twice on this function; a function takes each coord attribute at most once",
                    layer.kind.name()
                )));
            } else {
                seen.push(layer.kind);
            }
        }
        let first_of = |kind: Kind| layers.iter().find(|l| l.kind == kind);

        let key_from = shared(layers, "key_from", |l| l.key_from.as_ref(), &mut errors);
        let name = shared(layers, "name", |l| l.name.as_ref(), &mut errors);
        let coordinator = shared(
            layers,
            "coordinator",
            |l| l.coordinator.as_ref(),
            &mut errors,
        );
        let krate = shared(layers, "crate", |l| l.krate.as_ref(), &mut errors);

        if let Some(key_from) = key_from {
            check_paths(&key_from.value, "key_from", sig, &mut errors);
        }

        let idempotency = first_of(Kind::Idempotent).map(|layer| {
            if key_from.is_none() {
                errors.push(layer.error(
                    "#[idempotent] needs `key_from`: the parameter(s) that identify a request, \
                     as in `#[idempotent(key_from = \"idempotency_key\")]`",
                ));
            }
            let fingerprint = layer
                .fingerprint
                .as_ref()
                .map(|s| s.value.clone())
                .unwrap_or_default();
            check_paths(&fingerprint, "fingerprint", sig, &mut errors);
            IdempotencyLayer {
                retention_ms: layer
                    .retention
                    .as_ref()
                    .map_or(DEFAULT_RETENTION_MS, |s| s.value),
                in_flight_lease_ms: layer
                    .in_flight_lease
                    .as_ref()
                    .map_or(DEFAULT_IN_FLIGHT_LEASE_MS, |s| s.value),
                wait_ms: layer.wait.as_ref().map_or(0, |s| s.value),
                fingerprint,
                on_backend_error: layer.on_backend_error.as_ref().map(|s| s.value),
                lease_policy: lease_policy(
                    layer,
                    layer
                        .in_flight_lease
                        .as_ref()
                        .map_or(DEFAULT_IN_FLIGHT_LEASE_MS, |s| s.value),
                    "in_flight_lease",
                    &mut errors,
                ),
                on_abandoned: layer
                    .on_abandoned
                    .as_ref()
                    .map_or(Abandoned::Rerun, |s| s.value),
                on_store_error: layer
                    .on_store_error
                    .as_ref()
                    .map_or(StoreError::Error, |s| s.value),
                on_missing_key: layer
                    .on_missing_key
                    .as_ref()
                    .map_or(MissingKey::Fail, |s| s.value),
            }
        });

        let lock = first_of(Kind::DistributedLock).map(|layer| {
            let lease_ms = layer.lease.as_ref().map_or(DEFAULT_LEASE_MS, |s| s.value);
            LockLayer {
                lease_ms,
                wait_ms: layer.wait.as_ref().map_or(0, |s| s.value),
                fenced: layer.fenced.as_ref().is_some_and(|s| s.value),
                on_backend_error: layer.on_backend_error.as_ref().map(|s| s.value),
                lease_policy: lease_policy(layer, lease_ms, "lease", &mut errors),
            }
        });

        if let Some(err) = errors.into_error() {
            let mut errors = Errors::default();
            errors.push(err);
            return Err(errors);
        }

        Ok(Stack {
            idempotency,
            single_flight: first_of(Kind::SingleFlight).is_some(),
            lock,
            key: key_from.map(|s| s.value.clone()).unwrap_or_default(),
            name: name.map(|s| s.value.clone()),
            coordinator: coordinator.map(|s| s.value.clone()),
            krate: krate.map_or_else(default_crate, |s| s.value.clone()),
        })
    }
}

/// `::coord_core`: where the runtime is when the dependency is not renamed.
fn default_crate() -> Path {
    syn::parse_quote!(::coord_core)
}

/// Resolves `renew` and `on_lost` against the lease they apply to: `renew = true` renews every
/// third of the lease; an explicit interval must be shorter than the lease; `on_lost` defaults
/// to `cancel` when renewing.
fn lease_policy(layer: &Args, lease_ms: u64, lease_name: &str, errors: &mut Errors) -> LeasePolicy {
    let renew_ms = match layer.renew.as_ref() {
        None => None,
        Some(setting) => match setting.value {
            Renew::Off => None,
            Renew::Auto => Some((lease_ms / 3).max(1)),
            Renew::Every(every) => {
                if every >= lease_ms {
                    errors.push(setting.error(format!(
                        "`renew` must be shorter than the {lease_name} ({lease_ms} ms), or the lease \
                         lapses between renewals; `renew = true` renews every third of it"
                    )));
                }
                Some(every)
            }
        },
    };
    let on_lost = match layer.on_lost.as_ref() {
        Some(setting) => Some(setting.value),
        None => renew_ms.map(|_| Lost::Cancel),
    };
    LeasePolicy { renew_ms, on_lost }
}
