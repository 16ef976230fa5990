//! The validated model of one function's coord attributes: which layers it has, and the key,
//! name, coordinator and crate path they share.

use proc_macro2::Span;
use syn::ext::IdentExt;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, Ident, Pat, Path, Signature, Type};

use crate::args::Args;
use crate::errors::Errors;
use crate::options::PROFILE;
use crate::options::{
    self, Abandoned, CACHE_ERR, COORDINATOR, CRATE, FENCED, FINGERPRINT, IN_FLIGHT_LEASE, KEY_FROM,
    Kind, LEASE, LOCAL_TTL, Lost, MAX_CAPACITY, MODE, MissingKey, NAME, ON_ABANDONED,
    ON_BACKEND_ERROR, ON_LOST, ON_MISSING_KEY, ON_STORE_ERROR, OptionSpec, PERMITS, Policy,
    RECORD_KEY, RENEW, REPLICA_ACKS, REPLICA_ACKS_TIMEOUT, RETENTION, SCOPE, Scope, StoreError,
    TRANSACTION, TTL, WAIT,
};
use crate::options::{FLIGHT_LEASE, FLIGHT_SCOPE, FlightScope};
use crate::suggest;
use crate::value::{KeyPath, Renew, Setting, Value};

/// `#[single_flight(scope = "cluster")]`: the cluster step after the process flight.
pub(crate) struct ClusterFlightLayer {
    /// The lease of the leader's claim.
    pub(crate) lease_ms: u64,
    /// `replica_acks = ..` of the claim, its renewals and the hand-over: `None` leaves the
    /// provider's setting.
    pub(crate) replica_acks: Option<ReplicaAcksChoice>,
}

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
    /// The run-time `Written` flags of the options given rather than defaulted.
    pub(crate) written: Vec<&'static str>,
    /// `transaction = "tx"`: the outcome is written in this parameter's transaction.
    pub(crate) transaction: Option<TransactionParam>,
    /// `replica_acks = ..`: `None` leaves the provider's setting.
    pub(crate) replica_acks: Option<ReplicaAcksChoice>,
}

/// `replica_acks = n` (with `replica_acks_timeout`): the replica acknowledgement of one
/// operation's granting writes, overriding the provider's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ReplicaAcksChoice {
    /// `replica_acks = 0`: do not wait, whatever the provider's setting.
    Off,
    /// Wait for `replicas` (at least 1) for at most `timeout_ms`.
    Wait { replicas: u32, timeout_ms: u64 },
}

/// The parameter named by `transaction`: a `&mut` reference to the caller's transaction.
pub(crate) struct TransactionParam {
    /// The parameter's name as declared, with the user's span: the body's uses of it resolve
    /// to the generated rebinding of the same name.
    pub(crate) ident: Ident,
    /// Declared `mut tx: ..`: the rebinding is `mut` too.
    pub(crate) mutable: bool,
    /// Where the parameter's type is written: a type that is not a transaction coord can write
    /// in is reported there.
    pub(crate) ty_span: Span,
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
    /// `permits = n`: a semaphore of `n` permits; 0 without it (a lock).
    pub(crate) permits: u32,
    /// `mode = "read" | "write"`: a hold of a read-write lock; `None` without it.
    pub(crate) rw: Option<options::RwChoice>,
    /// `key_from_each = "accounts"`: one lock per element of this collection, taken together
    /// (a multi-key lock); `None`: one lock on the call's key.
    pub(crate) each: Option<KeyPath>,
    pub(crate) on_backend_error: Option<Policy>,
    pub(crate) lease_policy: LeasePolicy,
    /// The run-time `Written` flags of the options given rather than defaulted.
    pub(crate) written: Vec<&'static str>,
    /// `replica_acks = ..`: `None` leaves the provider's setting.
    pub(crate) replica_acks: Option<ReplicaAcksChoice>,
}

/// The `#[cached]` layer.
pub(crate) struct CacheLayer {
    pub(crate) ttl_ms: u64,
    pub(crate) scope: Scope,
    /// The local TTL of `two_tier` (a tenth of `ttl` unless given); equal to `ttl` otherwise.
    pub(crate) local_ttl_ms: u64,
    pub(crate) max_capacity: u64,
    pub(crate) cache_err: bool,
}

/// Everything code generation needs, checked.
pub(crate) struct Stack {
    pub(crate) idempotency: Option<IdempotencyLayer>,
    pub(crate) cache: Option<CacheLayer>,
    pub(crate) single_flight: bool,
    pub(crate) lock: Option<LockLayer>,
    /// The key parts, in order. Empty: the key is the operation name alone.
    pub(crate) key: Vec<KeyPath>,
    /// `name = ".."`; `None` means the module path and the fn name.
    pub(crate) name: Option<String>,
    pub(crate) coordinator: Option<Expr>,
    pub(crate) krate: Path,
    /// `record_key = true`: the span carries the key.
    pub(crate) record_key: bool,
    /// `profile = ".."`: the configured profile the layers take their values from.
    pub(crate) profile: Option<String>,
    /// Present with `#[single_flight(scope = "cluster")]`.
    pub(crate) cluster_flight: Option<ClusterFlightLayer>,
}

/// Picks the one value of a shared option across layers: the first one written, else the
/// table's default. A later layer that writes a different value gets an error naming the layer
/// that wrote the first one.
fn shared<'a>(layers: &'a [Args], spec: &OptionSpec, errors: &mut Errors) -> Option<&'a Value> {
    let option = spec.name;
    let mut first: Option<(&Setting<Value>, Kind)> = None;
    for layer in layers {
        let Some(setting) = layer.written(spec) else {
            continue;
        };
        match first {
            None => first = Some((setting, layer.kind)),
            Some((chosen, by)) if chosen.canonical != setting.canonical => {
                let what = if spec.name == KEY_FROM.name {
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
    match first {
        Some((setting, _)) => Some(&setting.value),
        None => layers
            .first()
            .and_then(|layer| layer.get(spec))
            .map(|s| &s.value),
    }
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
        if let Some(close) = suggest::closest(&root, names.iter().map(String::as_str)) {
            message.push_str(&format!("; did you mean `{close}`?"));
        }
        if names.is_empty() {
            message.push_str(&format!("\n`{fn_name}` has no parameter that can be named"));
        } else {
            message.push_str(&format!("\nparameters: {}", suggest::list(&names)));
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
            Kind::Cached => self.cache.is_some(),
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
        // An option with a default in the table always holds a value here: `Args` fills the
        // defaults in through the same parsers, and the table's tests prove each one parses as
        // its kind. The `unwrap_or` fallbacks below only keep this function total.

        // Every shared option is checked for agreement, whether or not code generation reads it.
        let mut shared_values = Vec::new();
        for spec in options::OPTIONS.iter().filter(|spec| spec.is_shared()) {
            shared_values.push((spec.name, shared(layers, spec, &mut errors)));
        }
        let shared_value = |spec: &OptionSpec| {
            shared_values
                .iter()
                .find(|(name, _)| *name == spec.name)
                .and_then(|(_, value)| *value)
        };
        let key: Vec<KeyPath> = match shared_value(&KEY_FROM) {
            Some(Value::Paths(paths)) => paths.clone(),
            _ => Vec::new(),
        };
        let name = match shared_value(&NAME) {
            Some(Value::Name(name)) => Some(name.clone()),
            _ => None,
        };
        let coordinator = match shared_value(&COORDINATOR) {
            Some(Value::Expr(expr)) => Some(expr.clone()),
            _ => None,
        };
        let record_key = matches!(shared_value(&RECORD_KEY), Some(Value::Bool(true)));
        let krate = match shared_value(&CRATE) {
            Some(Value::Path(path)) => path.clone(),
            _ => default_crate(),
        };

        check_paths(&key, KEY_FROM.name, sig, &mut errors);

        let idempotency = first_of(Kind::Idempotent).map(|layer| {
            if shared_value(&KEY_FROM).is_none() {
                errors.push(layer.error(
                    "#[idempotent] needs `key_from`: the parameter(s) that identify a request, \
                     as in `#[idempotent(key_from = \"idempotency_key\")]`",
                ));
            }
            let fingerprint = layer.paths(&FINGERPRINT).unwrap_or_default().to_vec();
            check_paths(&fingerprint, FINGERPRINT.name, sig, &mut errors);
            let in_flight_lease_ms = layer.millis(&IN_FLIGHT_LEASE).unwrap_or_default();
            let transaction = transaction_param(layer, sig, &mut errors);
            IdempotencyLayer {
                retention_ms: layer.millis(&RETENTION).unwrap_or_default(),
                in_flight_lease_ms,
                wait_ms: layer.millis(&WAIT).unwrap_or_default(),
                fingerprint,
                on_backend_error: layer.choice(&ON_BACKEND_ERROR),
                lease_policy: lease_policy(layer, in_flight_lease_ms, &mut errors),
                on_abandoned: layer.choice(&ON_ABANDONED).unwrap_or(Abandoned::Rerun),
                on_store_error: layer.choice(&ON_STORE_ERROR).unwrap_or(StoreError::Error),
                on_missing_key: layer.choice(&ON_MISSING_KEY).unwrap_or(MissingKey::Fail),
                written: written_flags(layer),
                transaction,
                replica_acks: replica_acks(layer, &mut errors),
            }
        });

        let cache = first_of(Kind::Cached).map(|layer| cache_layer(layer, &mut errors));

        let lock = first_of(Kind::DistributedLock).map(|layer| {
            let lease_ms = layer.millis(&LEASE).unwrap_or_default();
            if layer.written(&PERMITS).is_some() && layer.flag(&FENCED) == Some(false) {
                if let Some(setting) = layer.written(&FENCED) {
                    errors.push(setting.error(
                        "every semaphore permit carries its own fencing token: remove `fenced = false` (with `permits`, `fencing_token()` always reads it)",
                    ));
                }
            }
            let rw = rw_mode(layer, &mut errors);
            let each = crate::multi_lock_model::each_path(layer, &mut errors);
            if let Some(each) = &each {
                check_paths(
                    std::slice::from_ref(each),
                    options::KEY_FROM_EACH.name,
                    sig,
                    &mut errors,
                );
            }
            LockLayer {
                lease_ms,
                rw,
                wait_ms: layer.millis(&WAIT).unwrap_or_default(),
                // Every key of a multi-key lock is fenced (see `multi_lock_model`).
                fenced: layer.flag(&FENCED).unwrap_or_default() || each.is_some(),
                each,
                // Parsed as a `u32` from 1 up (see `parse_value::parse_permits`).
                permits: layer
                    .count(&PERMITS)
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(0),
                on_backend_error: layer.choice(&ON_BACKEND_ERROR),
                lease_policy: lease_policy(layer, lease_ms, &mut errors),
                written: written_flags(layer),
                replica_acks: replica_acks(layer, &mut errors),
            }
        });
        let profile = match shared_value(&PROFILE) {
            Some(Value::Name(name)) => Some(name.clone()),
            _ => None,
        };
        if profile.is_some() && idempotency.is_none() && lock.is_none() {
            if let Some(setting) = layers.iter().find_map(|layer| layer.written(&PROFILE)) {
                errors.push(setting.error(
                    "`profile` sets the durations and policy of #[idempotent] and \
                     #[distributed_lock], and this function has neither: remove it, or add one of them",
                ));
            }
        }

        // The layers of this function that take `replica_acks` for writes of their own.
        let granting: Vec<Kind> = [
            (Kind::Idempotent, idempotency.is_some()),
            (Kind::DistributedLock, lock.is_some()),
        ]
        .into_iter()
        .filter_map(|(kind, present)| present.then_some(kind))
        .collect();
        let cluster_flight = first_of(Kind::SingleFlight)
            .and_then(|layer| cluster_flight_layer(layer, &granting, &mut errors));

        if let Some(err) = errors.into_error() {
            let mut errors = Errors::default();
            errors.push(err);
            return Err(errors);
        }

        Ok(Stack {
            idempotency,
            cache,
            single_flight: first_of(Kind::SingleFlight).is_some(),
            lock,
            key,
            name,
            coordinator,
            krate,
            record_key,
            profile,
            cluster_flight,
        })
    }
}

/// Resolves `transaction = "tx"` against the signature: it names a parameter, declared by name,
/// whose type is a `&mut` reference; and the options that decide what becomes of an unstored
/// outcome do not contradict writing it in the transaction. Every mistake is pushed.
fn transaction_param(
    layer: &Args,
    sig: &Signature,
    errors: &mut Errors,
) -> Option<TransactionParam> {
    layer.written(&TRANSACTION)?;
    let path = layer.paths(&TRANSACTION)?.first()?;
    let option = TRANSACTION.name;
    if let Some(policy) = layer.written(&ON_ABANDONED) {
        if layer.choice(&ON_ABANDONED) == Some(Abandoned::Fail) {
            errors.push(policy.error(format!(
                "`{} = \"fail\"` cannot go with `{option}`: a marker whose outcome is written in the \
                 transaction never leaves an unknown outcome (its run commits with its record, or not \
                 at all), so a lapsed one is simply free; remove `{}`",
                ON_ABANDONED.name, ON_ABANDONED.name
            )));
        }
    }
    if let Some(policy) = layer.written(&ON_STORE_ERROR) {
        if layer.choice(&ON_STORE_ERROR) == Some(StoreError::ReturnOk) {
            errors.push(policy.error(format!(
                "`{} = \"return_ok\"` cannot go with `{option}`: an outcome that could not be written \
                 in the transaction leaves it unable to commit, so the `Ok` would be a lie; the \
                 caller gets `CoordError::TransactionRollbackOnly` and rolls back",
                ON_STORE_ERROR.name
            )));
        }
    }
    let before = errors.count();
    check_paths(std::slice::from_ref(path), option, sig, errors);
    if errors.count() > before {
        return None;
    }
    let root = path.root.unraw().to_string();
    let needs = "a parameter that is a `&mut` reference to the transaction (such as \
                 `tx: &mut Transaction<'_>`), which the body uses and coord writes the outcome in \
                 afterwards";
    for input in &sig.inputs {
        match input {
            FnArg::Receiver(receiver) if root == "self" => {
                errors.push(syn::Error::new_spanned(
                    receiver,
                    format!("`{option}` names the receiver `self`; it must name {needs}"),
                ));
                return None;
            }
            FnArg::Typed(typed) => {
                let Pat::Ident(pat) = &*typed.pat else {
                    continue;
                };
                if pat.ident.unraw() != root {
                    continue;
                }
                if !is_mut_reference(&typed.ty) {
                    errors.push(syn::Error::new_spanned(
                        &typed.ty,
                        format!(
                            "`{option}` names `{root}`, whose type is not a `&mut` reference; it \
                             must name {needs}"
                        ),
                    ));
                    return None;
                }
                if pat.by_ref.is_some() || pat.subpat.is_some() {
                    errors.push(syn::Error::new_spanned(
                        pat,
                        format!(
                            "`{option}` names `{root}`: bind it by name alone (`{root}: &mut ..`)"
                        ),
                    ));
                    return None;
                }
                return Some(TransactionParam {
                    ident: pat.ident.clone(),
                    mutable: pat.mutability.is_some(),
                    ty_span: typed.ty.span(),
                });
            }
            FnArg::Receiver(_) => {}
        }
    }
    None
}

/// `&mut T`, looking through the invisible groups and parentheses a macro may leave around it.
fn is_mut_reference(ty: &Type) -> bool {
    match ty {
        Type::Reference(reference) => reference.mutability.is_some(),
        Type::Group(group) => is_mut_reference(&group.elem),
        Type::Paren(paren) => is_mut_reference(&paren.elem),
        _ => false,
    }
}

/// The `Written` flags (as named in the runtime) of the options `layer` was given.
fn written_flags(layer: &Args) -> Vec<&'static str> {
    let mut flags = Vec::new();
    for (spec, flag) in [
        (&LEASE, "LEASE"),
        (&WAIT, "WAIT"),
        (&RETENTION, "RETENTION"),
        (&IN_FLIGHT_LEASE, "IN_FLIGHT_LEASE"),
        (&RENEW, "RENEW"),
    ] {
        if spec.takes(layer.kind) && layer.written(spec).is_some() {
            flags.push(flag);
        }
    }
    if matches!(layer.renew(&RENEW), Some((Renew::Auto, _))) {
        flags.push("RENEW_AUTO");
    }
    flags
}

/// `::coord_core`: where the runtime is when the dependency is not renamed.
fn default_crate() -> Path {
    syn::parse_quote!(::coord_core)
}

/// Resolves `renew` and `on_lost` against the lease they apply to (the cross-option checks):
/// `renew = true` renews every third of the lease; an explicit interval must be shorter than
/// the lease; `on_lost` defaults to `cancel` when renewing.
fn lease_policy(layer: &Args, lease_ms: u64, errors: &mut Errors) -> LeasePolicy {
    let lease_name = layer
        .kind
        .lease_option()
        .map_or(LEASE.name, |spec| spec.name);
    let renew_ms = match layer.renew(&RENEW) {
        None | Some((Renew::Off, _)) => None,
        Some((Renew::Auto, _)) => Some((lease_ms / 3).max(1)),
        Some((Renew::Every(every), setting)) => {
            if every >= lease_ms {
                errors.push(setting.error(format!(
                    "`{}` must be shorter than the {lease_name} ({lease_ms} ms), or the lease \
                     lapses between renewals; `{} = true` renews every third of it",
                    RENEW.name, RENEW.name
                )));
            }
            Some(every)
        }
    };
    let on_lost = layer
        .choice::<Lost>(&ON_LOST)
        .or_else(|| renew_ms.map(|_| Lost::Cancel));
    LeasePolicy { renew_ms, on_lost }
}

/// Resolves `#[cached]`: `ttl` is required; `local_ttl` belongs to `two_tier` and must be
/// shorter than `ttl`; `max_capacity` sizes a local tier, which `shared` does not have.
fn cache_layer(layer: &Args, errors: &mut Errors) -> CacheLayer {
    let ttl_ms = layer.millis(&TTL);
    if ttl_ms.is_none() && !layer.was_written(&TTL) {
        errors.push(layer.error(format!(
            "#[cached] needs `{}`: how long an answer is served, as in `#[cached(ttl = \"30s\")]`",
            TTL.name
        )));
    }
    let ttl_ms = ttl_ms.unwrap_or(1);
    let scope = layer.choice::<Scope>(&SCOPE).unwrap_or(Scope::Local);
    let local_ttl_ms = match (layer.written(&LOCAL_TTL), layer.millis(&LOCAL_TTL)) {
        (Some(setting), Some(ms)) => {
            if scope != Scope::TwoTier {
                errors.push(setting.error(format!(
                    "`{}` applies to `{} = \"two_tier\"` only: the other scopes keep an answer for `{}`",
                    LOCAL_TTL.name, SCOPE.name, TTL.name
                )));
            } else if ms >= ttl_ms {
                errors.push(setting.error(format!(
                    "`{}` must be shorter than the `{}` ({ttl_ms} ms): the local copy of an answer must not outlive the shared one",
                    LOCAL_TTL.name, TTL.name
                )));
            }
            ms
        }
        _ if scope == Scope::TwoTier => (ttl_ms / 10).max(1),
        _ => ttl_ms,
    };
    if scope == Scope::Shared {
        if let Some(setting) = layer.written(&MAX_CAPACITY) {
            errors.push(setting.error(format!(
                "`{}` sizes the local tier, and `{} = \"shared\"` has none; use `\"two_tier\"` for a local tier in front of the shared one",
                MAX_CAPACITY.name, SCOPE.name
            )));
        }
    }
    CacheLayer {
        ttl_ms,
        scope,
        local_ttl_ms,
        max_capacity: layer.count(&MAX_CAPACITY).unwrap_or(10_000),
        cache_err: layer.flag(&CACHE_ERR).unwrap_or_default(),
    }
}

/// Resolves `#[single_flight]`'s `scope`, `lease` and `replica_acks`: they belong to the
/// cluster scope (the process flight holds nothing that could outlive its process, and writes
/// nothing a replica could hold). `granting`: the function's other layers that take
/// `replica_acks` (`#[idempotent]`, `#[distributed_lock]`), where a misplaced one was
/// probably meant to go.
fn cluster_flight_layer(
    layer: &Args,
    granting: &[Kind],
    errors: &mut Errors,
) -> Option<ClusterFlightLayer> {
    let scope = layer
        .choice::<FlightScope>(&FLIGHT_SCOPE)
        .unwrap_or(FlightScope::Process);
    let lease = layer.written(&FLIGHT_LEASE);
    match scope {
        FlightScope::Process => {
            if let Some(setting) = lease {
                errors.push(setting.error(format!(
                    "`{}` applies to `{} = \"cluster\"` only: a process flight holds no claim that could outlive its process",
                    FLIGHT_LEASE.name, FLIGHT_SCOPE.name
                )));
            }
            // The first of the two written is the one to point at; `replica_acks_timeout`
            // alone is refused here too, rather than with the cluster-scope pairing rules.
            let acks = layer
                .written(&REPLICA_ACKS)
                .map(|setting| (setting, REPLICA_ACKS.name))
                .or_else(|| {
                    layer
                        .written(&REPLICA_ACKS_TIMEOUT)
                        .map(|setting| (setting, REPLICA_ACKS_TIMEOUT.name))
                });
            if let Some((setting, name)) = acks {
                let mut message = format!(
                    "`{name}` on #[single_flight] applies to `{} = \"cluster\"` only: a process \
                     flight writes nothing to the provider, so no replica could acknowledge it",
                    FLIGHT_SCOPE.name
                );
                if !granting.is_empty() {
                    let on: Vec<String> = granting
                        .iter()
                        .map(|kind| format!("#[{}]", kind.name()))
                        .collect();
                    message.push_str(&format!(
                        "; for this function's {} write it on {}: each attribute's options \
                         apply to its own layer",
                        if granting.len() == 1 && granting[0] == Kind::DistributedLock {
                            "lock,"
                        } else if granting.len() == 1 {
                            "idempotency record,"
                        } else {
                            "idempotency record or lock,"
                        },
                        on.join(" or ")
                    ));
                }
                errors.push(setting.error(message));
            }
            None
        }
        FlightScope::Cluster => Some(ClusterFlightLayer {
            lease_ms: layer.millis(&FLIGHT_LEASE).unwrap_or(10_000),
            replica_acks: replica_acks(layer, errors),
        }),
    }
}

/// `mode = "read" | "write"`, checked against the options it cannot go with: `permits` (a
/// call holds a read-write lock or a semaphore, not both) and `fenced = false` (every hold of
/// a read-write lock is fenced).
fn rw_mode(layer: &Args, errors: &mut Errors) -> Option<options::RwChoice> {
    let mode = layer.choice::<options::RwChoice>(&MODE)?;
    let written = layer.written(&MODE)?;
    if layer.written(&PERMITS).is_some() {
        errors.push(written.error(
            "`mode` takes a read-write lock and `permits` a semaphore: a call holds one of them, \
             not both (remove `mode` for a semaphore, or `permits` for a read-write lock)",
        ));
    }
    if layer.flag(&FENCED) == Some(false) {
        if let Some(setting) = layer.written(&FENCED) {
            errors.push(setting.error(
                "every hold of a read-write lock carries its own fencing token: remove \
                 `fenced = false` (with `mode`, `fencing_token()` always reads it)",
            ));
        }
    }
    Some(mode)
}

/// Resolves `replica_acks` and `replica_acks_timeout`: a count of replicas that fits the
/// runtime's `u32`; a timeout exactly when there is something to wait for (`replica_acks` of 1
/// or more), since a default would hide how long every grant may block. Every mistake is
/// pushed.
fn replica_acks(layer: &Args, errors: &mut Errors) -> Option<ReplicaAcksChoice> {
    let count = layer.written(&REPLICA_ACKS);
    let timeout = layer.written(&REPLICA_ACKS_TIMEOUT);
    let (acks, timeout_name) = (REPLICA_ACKS.name, REPLICA_ACKS_TIMEOUT.name);
    let Some(count) = count else {
        // A count written with a bad value has its own error already.
        if let Some(timeout) = timeout.filter(|_| !layer.was_written(&REPLICA_ACKS)) {
            errors.push(timeout.error(format!(
                "`{timeout_name}` is how long to wait for the `{acks}` replicas, and no `{acks}` is \
                 given: add `{acks} = 1` (or more), or remove `{timeout_name}` to keep the \
                 provider's setting"
            )));
        }
        return None;
    };
    let replicas = match layer.count(&REPLICA_ACKS).map(u32::try_from) {
        Some(Ok(n)) => n,
        Some(Err(_)) => {
            errors.push(count.error(format!(
                "`{acks}` takes a number of replicas from 0 to {}",
                u32::MAX
            )));
            return None;
        }
        // The value did not parse: its error is reported already.
        None => return None,
    };
    if replicas == 0 {
        if let Some(timeout) = timeout {
            errors.push(timeout.error(format!(
                "`{acks} = 0` waits for no replica, so there is nothing to time: remove \
                 `{timeout_name}`"
            )));
        }
        return Some(ReplicaAcksChoice::Off);
    }
    let Some(timeout_ms) = layer.millis(&REPLICA_ACKS_TIMEOUT) else {
        if !layer.was_written(&REPLICA_ACKS_TIMEOUT) {
            errors.push(count.error(format!(
                "`{acks} = {replicas}` needs `{timeout_name}`: how long each write waits for the \
                 replicas before it counts as failed, below the provider's command timeout, as in \
                 `{timeout_name} = \"500ms\"`"
            )));
        }
        return None;
    };
    Some(ReplicaAcksChoice::Wait {
        replicas,
        timeout_ms,
    })
}
