//! Every option of the three attributes, declared once.
//!
//! [`OPTIONS`] is the single place an option's name is spelled. Parsing, the unknown-option
//! errors (with their suggestions and "belongs to another attribute" hints), duplicate
//! detection, the bare-option hint, the layers' shared-option check, the defaults the code
//! generator uses and the check of the rustdoc option lists in `lib.rs` all read it. The rest
//! of the crate refers to an option through its row ([`RETENTION`], [`LEASE`], ...), so a
//! misspelled option is a compile error, not a silently ignored string.

/// The four attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Idempotent,
    Cached,
    SingleFlight,
    DistributedLock,
}

impl Kind {
    /// Every kind, in canonical nesting order (outermost first).
    pub(crate) const ALL: [Kind; 4] = [
        Kind::Idempotent,
        Kind::Cached,
        Kind::SingleFlight,
        Kind::DistributedLock,
    ];

    /// The attribute's name as written.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Kind::Idempotent => "idempotent",
            Kind::Cached => "cached",
            Kind::SingleFlight => "single_flight",
            Kind::DistributedLock => "distributed_lock",
        }
    }

    /// The kind an attribute name stands for.
    pub(crate) fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Every option this attribute takes, in table order (the shared ones first).
    pub(crate) fn options(self) -> impl Iterator<Item = &'static OptionSpec> {
        OPTIONS.iter().copied().filter(move |spec| spec.takes(self))
    }

    /// The lease that `renew` and `on_lost` apply to on this attribute, if it holds one: the
    /// cross-option check "`renew` is shorter than the lease" reads it.
    pub(crate) fn lease_option(self) -> Option<&'static OptionSpec> {
        match self {
            Kind::Idempotent => Some(&IN_FLIGHT_LEASE),
            Kind::Cached | Kind::SingleFlight => None,
            Kind::DistributedLock => Some(&LEASE),
        }
    }
}

/// What an option's value is, which picks the one parser that reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ValueKind {
    /// A duration in a string (`"30s"`); `positive` rejects zero.
    Duration { positive: bool },
    /// `true` or `false`.
    Bool,
    /// One parameter path or a list of them: `"tenant_id"`, `["order.id", region]`.
    KeyPaths,
    /// A whole number, bare (`10_000`) or in a string; `positive` rejects zero.
    Count { positive: bool },
    /// A bare integer literal from 1 to `u32::MAX` (a number of semaphore permits): no string,
    /// no zero, no fraction.
    Permits,
    /// One word out of a fixed set, quoted or bare.
    Choice(&'static [&'static str]),
    /// An expression, bare or in a string.
    Expr,
    /// A crate path, bare or in a string.
    CratePath,
    /// An operation name in a string.
    OperationName,
    /// `true`, `false` or an interval in a string.
    Renew,
    /// A profile name in a string.
    ProfileName,
    /// One parameter of the function, by name: `"tx"` or `tx`.
    Parameter,
}

/// One option: everything the macros know about it.
#[derive(Debug)]
pub(crate) struct OptionSpec {
    /// The name as written in the attribute.
    pub(crate) name: &'static str,
    /// The attributes that take it; an option every attribute takes describes the call and is
    /// shared by the layers of one function.
    pub(crate) attributes: &'static [Kind],
    pub(crate) value: ValueKind,
    /// A value as written, shown when the option is written without one.
    pub(crate) example: &'static str,
    /// The value used when the option is not given, as written; `None` when leaving it out
    /// has a meaning of its own (described in `doc`).
    pub(crate) default: Option<&'static str>,
    /// What the option does, in one line.
    pub(crate) doc: &'static str,
}

impl OptionSpec {
    /// Whether `kind` takes this option.
    pub(crate) fn takes(&self, kind: Kind) -> bool {
        self.attributes.contains(&kind)
    }

    /// Whether every attribute takes it, so that the layers of one function share its value.
    pub(crate) fn is_shared(&self) -> bool {
        Kind::ALL.into_iter().all(|kind| self.takes(kind))
    }
}

/// A word-valued option's words, tied to the enum the code generator matches on, so the
/// words are spelled once (in the `choice!` invocation) and the generator stays exhaustive.
pub(crate) trait Choice: Copy + 'static {
    /// The words, in declaration order.
    const WORDS: &'static [&'static str];
    /// The variant a word stands for.
    fn from_word(word: &str) -> Option<Self>;
}

/// Declares a word-valued option's enum and its [`Choice`] words.
macro_rules! choice {
    ($(#[$meta:meta])* $name:ident { $($word:literal => $variant:ident),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub(crate) enum $name {
            $($variant),+
        }

        impl Choice for $name {
            const WORDS: &'static [&'static str] = &[$($word),+];

            fn from_word(word: &str) -> Option<Self> {
                match word {
                    $($word => Some($name::$variant),)+
                    _ => None,
                }
            }
        }
    };
}

choice!(
    /// What the call does when the coordination backend fails.
    Policy { "fail_closed" => FailClosed, "fail_open" => FailOpen }
);
choice!(
    /// What happens to the body when its lease is lost.
    Lost { "cancel" => Cancel, "signal" => Signal }
);
choice!(
    /// What a duplicate does when an earlier call's marker lapsed without completing.
    Abandoned { "rerun" => Rerun, "fail" => Fail }
);
choice!(
    /// What a call whose `Ok` could not be stored returns.
    StoreError { "error" => Error, "return_ok" => ReturnOk }
);
choice!(
    /// Where `#[cached]` keeps its entries.
    Scope { "local" => Local, "shared" => Shared, "two_tier" => TwoTier }
);
choice!(
    /// What a call whose key has a `None` part does.
    MissingKey { "fail" => Fail, "run_unprotected" => RunUnprotected }
);
choice!(
    /// Which side of a read-write lock `#[distributed_lock]` takes.
    RwChoice { "read" => Read, "write" => Write }
);
choice!(
    /// Where `#[single_flight]` coalesces calls.
    FlightScope { "process" => Process, "cluster" => Cluster }
);

const EVERY: &[Kind] = &Kind::ALL;
const IDEMPOTENT: &[Kind] = &[Kind::Idempotent];
const LOCK: &[Kind] = &[Kind::DistributedLock];
const IDEMPOTENT_AND_LOCK: &[Kind] = &[Kind::Idempotent, Kind::DistributedLock];
/// The attributes whose layer writes something a replica could hold: `#[single_flight]`'s
/// only with `scope = "cluster"` (see `model`).
const GRANTING: &[Kind] = &[Kind::Idempotent, Kind::SingleFlight, Kind::DistributedLock];
const CACHED: &[Kind] = &[Kind::Cached];
const SINGLE_FLIGHT: &[Kind] = &[Kind::SingleFlight];

pub(crate) const KEY_FROM: OptionSpec = OptionSpec {
    name: "key_from",
    attributes: EVERY,
    value: ValueKind::KeyPaths,
    example: "\"tenant_id\"",
    default: None,
    doc: "the parameters (or fields of them) that make up the key",
};
pub(crate) const NAME: OptionSpec = OptionSpec {
    name: "name",
    attributes: EVERY,
    value: ValueKind::OperationName,
    example: "\"payments.charge\"",
    default: None,
    doc: "the operation name, the first part of every key",
};
pub(crate) const COORDINATOR: OptionSpec = OptionSpec {
    name: "coordinator",
    attributes: EVERY,
    value: ValueKind::Expr,
    example: "self.coordinator",
    default: None,
    doc: "the coordinator to use, evaluated on every call",
};
pub(crate) const CRATE: OptionSpec = OptionSpec {
    name: "crate",
    attributes: EVERY,
    value: ValueKind::CratePath,
    example: "\"coord_core\"",
    default: Some("::coord_core"),
    doc: "where `coord_core` is, for a renamed dependency",
};
pub(crate) const RECORD_KEY: OptionSpec = OptionSpec {
    name: "record_key",
    attributes: EVERY,
    value: ValueKind::Bool,
    example: "true",
    default: Some("false"),
    doc: "record the call's key on its `coord` span (keys can carry personal data)",
};
pub(crate) const PROFILE: OptionSpec = OptionSpec {
    name: "profile",
    attributes: EVERY,
    value: ValueKind::ProfileName,
    example: "\"payments\"",
    default: None,
    doc: "the configured profile whose durations and policy override the literals at run time",
};
pub(crate) const RETENTION: OptionSpec = OptionSpec {
    name: "retention",
    attributes: IDEMPOTENT,
    value: ValueKind::Duration { positive: true },
    example: "\"30s\"",
    default: Some("\"24h\""),
    doc: "how long a successful outcome is kept and replayed",
};
pub(crate) const IN_FLIGHT_LEASE: OptionSpec = OptionSpec {
    name: "in_flight_lease",
    attributes: IDEMPOTENT,
    value: ValueKind::Duration { positive: true },
    example: "\"30s\"",
    default: Some("\"30s\""),
    doc: "how long a running call's claim on the key lasts if its process dies",
};
pub(crate) const LEASE: OptionSpec = OptionSpec {
    name: "lease",
    attributes: LOCK,
    value: ValueKind::Duration { positive: true },
    example: "\"30s\"",
    default: Some("\"30s\""),
    doc: "how long the lock lasts if its holder stops without releasing it",
};
pub(crate) const WAIT: OptionSpec = OptionSpec {
    name: "wait",
    attributes: IDEMPOTENT_AND_LOCK,
    value: ValueKind::Duration { positive: false },
    example: "\"30s\"",
    default: Some("\"0s\""),
    doc: "how long a call waits for the key to be free before failing",
};
pub(crate) const FENCED: OptionSpec = OptionSpec {
    name: "fenced",
    attributes: LOCK,
    value: ValueKind::Bool,
    example: "true",
    default: Some("false"),
    doc: "mint a fencing token with each acquisition",
};
pub(crate) const PERMITS: OptionSpec = OptionSpec {
    name: "permits",
    attributes: LOCK,
    value: ValueKind::Permits,
    example: "5",
    // Without it, a lock: one holder (see `model`).
    default: None,
    doc: "let this many holders in at once (a semaphore, each permit fenced) instead of one",
};
pub(crate) const MODE: OptionSpec = OptionSpec {
    name: "mode",
    attributes: LOCK,
    value: ValueKind::Choice(RwChoice::WORDS),
    example: "\"read\"",
    // Without it, a lock (or a semaphore with `permits`), not a read-write lock (see `model`).
    default: None,
    doc: "take a read-write lock for reading (shared) or writing (alone), each hold fenced",
};

pub(crate) const KEY_FROM_EACH: OptionSpec = OptionSpec {
    name: "key_from_each",
    attributes: LOCK,
    value: ValueKind::KeyPaths,
    example: "\"accounts\"",
    // Without it, one lock on the call's key (see `model`).
    default: None,
    doc: "a collection parameter: lock one key per element, all together, in canonical order",
};
pub(crate) const FINGERPRINT: OptionSpec = OptionSpec {
    name: "fingerprint",
    attributes: IDEMPOTENT,
    value: ValueKind::KeyPaths,
    example: "\"tenant_id\"",
    default: None,
    doc: "the parameters whose values must match for a key to be replayed",
};
pub(crate) const ON_BACKEND_ERROR: OptionSpec = OptionSpec {
    name: "on_backend_error",
    attributes: IDEMPOTENT_AND_LOCK,
    value: ValueKind::Choice(Policy::WORDS),
    example: "\"fail_closed\"",
    default: None,
    doc: "what to do when the backend fails; without it, the coordinator's policy",
};
pub(crate) const RENEW: OptionSpec = OptionSpec {
    name: "renew",
    attributes: IDEMPOTENT_AND_LOCK,
    value: ValueKind::Renew,
    example: "true",
    default: Some("false"),
    doc: "renew the lease while the body runs, every third of it or at the interval given",
};
pub(crate) const ON_LOST: OptionSpec = OptionSpec {
    name: "on_lost",
    attributes: IDEMPOTENT_AND_LOCK,
    value: ValueKind::Choice(Lost::WORDS),
    example: "\"cancel\"",
    // Depends on `renew`: "cancel" when renewing, nothing otherwise (see `model`).
    default: None,
    doc: "what happens to the body when the lease is lost while it runs",
};
pub(crate) const REPLICA_ACKS: OptionSpec = OptionSpec {
    name: "replica_acks",
    attributes: GRANTING,
    value: ValueKind::Count { positive: false },
    example: "1",
    // Without it, the provider's own setting; `0` turns waiting off (see `model`).
    default: None,
    doc: "wait for this many replicas to hold each granting write (`0`: do not wait)",
};
pub(crate) const REPLICA_ACKS_TIMEOUT: OptionSpec = OptionSpec {
    name: "replica_acks_timeout",
    attributes: GRANTING,
    value: ValueKind::Duration { positive: true },
    example: "\"500ms\"",
    // Required with `replica_acks` of 1 or more, refused otherwise (see `model`).
    default: None,
    doc: "how long each granting write waits for the `replica_acks` replicas",
};
pub(crate) const ON_ABANDONED: OptionSpec = OptionSpec {
    name: "on_abandoned",
    attributes: IDEMPOTENT,
    value: ValueKind::Choice(Abandoned::WORDS),
    example: "\"rerun\"",
    default: Some("\"rerun\""),
    doc: "what a duplicate does when an earlier call lapsed without completing",
};
pub(crate) const ON_STORE_ERROR: OptionSpec = OptionSpec {
    name: "on_store_error",
    attributes: IDEMPOTENT,
    value: ValueKind::Choice(StoreError::WORDS),
    example: "\"error\"",
    default: Some("\"error\""),
    doc: "what a call returns when its `Ok` outcome could not be stored",
};
pub(crate) const ON_MISSING_KEY: OptionSpec = OptionSpec {
    name: "on_missing_key",
    attributes: IDEMPOTENT,
    value: ValueKind::Choice(MissingKey::WORDS),
    example: "\"fail\"",
    default: Some("\"fail\""),
    doc: "what a call does when a part of its key is `None`",
};
pub(crate) const TRANSACTION: OptionSpec = OptionSpec {
    name: "transaction",
    attributes: IDEMPOTENT,
    value: ValueKind::Parameter,
    example: "\"tx\"",
    // Without it, the outcome is stored by the provider on its own connection.
    default: None,
    doc: "the `&mut` transaction parameter the outcome is written in, with the body's effects",
};

pub(crate) const TTL: OptionSpec = OptionSpec {
    name: "ttl",
    attributes: CACHED,
    value: ValueKind::Duration { positive: true },
    example: "\"30s\"",
    default: None,
    doc: "how long an answer is served from the cache (required)",
};
pub(crate) const SCOPE: OptionSpec = OptionSpec {
    name: "scope",
    attributes: CACHED,
    value: ValueKind::Choice(Scope::WORDS),
    example: "\"local\"",
    default: Some("\"local\""),
    doc: "where answers are kept: this process, the provider, or both",
};
pub(crate) const MAX_CAPACITY: OptionSpec = OptionSpec {
    name: "max_capacity",
    attributes: CACHED,
    value: ValueKind::Count { positive: true },
    example: "10_000",
    default: Some("10_000"),
    doc: "how many entries the local tier holds",
};
pub(crate) const LOCAL_TTL: OptionSpec = OptionSpec {
    name: "local_ttl",
    attributes: CACHED,
    value: ValueKind::Duration { positive: true },
    example: "\"5s\"",
    // A tenth of `ttl` (see `model`).
    default: None,
    doc: "how long `two_tier` keeps an answer in this process, shorter than `ttl`",
};
pub(crate) const CACHE_ERR: OptionSpec = OptionSpec {
    name: "cache_err",
    attributes: CACHED,
    value: ValueKind::Bool,
    example: "true",
    default: Some("false"),
    doc: "cache `Err` outcomes too",
};

pub(crate) const FLIGHT_SCOPE: OptionSpec = OptionSpec {
    name: "scope",
    attributes: SINGLE_FLIGHT,
    value: ValueKind::Choice(FlightScope::WORDS),
    example: "\"cluster\"",
    default: Some("\"process\""),
    doc: "which calls share a run: this process's, or every instance's sharing the provider",
};
pub(crate) const FLIGHT_LEASE: OptionSpec = OptionSpec {
    name: "lease",
    attributes: SINGLE_FLIGHT,
    value: ValueKind::Duration { positive: true },
    example: "\"10s\"",
    // 10 s with `scope = "cluster"`; refused with `"process"` (see `model`).
    default: None,
    doc: "how long a cluster leader's claim lasts if its instance dies",
};

/// Every option, in the order they are listed to users: the shared ones first.
pub(crate) static OPTIONS: &[&OptionSpec] = &[
    &KEY_FROM,
    &NAME,
    &COORDINATOR,
    &CRATE,
    &RECORD_KEY,
    &PROFILE,
    &RETENTION,
    &IN_FLIGHT_LEASE,
    &LEASE,
    &WAIT,
    &FENCED,
    &PERMITS,
    &MODE,
    &KEY_FROM_EACH,
    &FINGERPRINT,
    &ON_BACKEND_ERROR,
    &RENEW,
    &ON_LOST,
    &REPLICA_ACKS,
    &REPLICA_ACKS_TIMEOUT,
    &ON_ABANDONED,
    &ON_STORE_ERROR,
    &ON_MISSING_KEY,
    &TRANSACTION,
    &TTL,
    &SCOPE,
    &MAX_CAPACITY,
    &LOCAL_TTL,
    &CACHE_ERR,
    &FLIGHT_SCOPE,
    &FLIGHT_LEASE,
];

/// The row of `kind`'s option called `name`: rows are keyed by name and attribute, since two
/// attributes may give one name different meanings (`scope` on `#[cached]` and `#[single_flight]`).
pub(crate) fn lookup_for(name: &str, kind: Kind) -> Option<&'static OptionSpec> {
    OPTIONS
        .iter()
        .copied()
        .find(|spec| spec.name == name && spec.takes(kind))
}

/// Every attribute that has an option called `name`.
pub(crate) fn attributes_taking(name: &str) -> Vec<Kind> {
    Kind::ALL
        .into_iter()
        .filter(|kind| lookup_for(name, *kind).is_some())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_every_option_is_taken_by_some_attribute() {
        for (index, spec) in OPTIONS.iter().enumerate() {
            assert!(
                OPTIONS[index + 1..]
                    .iter()
                    .all(|o| o.name != spec.name || o.attributes.iter().all(|k| !spec.takes(*k))),
                "`{}` is in the table twice for one attribute",
                spec.name
            );
            assert!(
                !spec.attributes.is_empty(),
                "`{}` has no attribute",
                spec.name
            );
            assert!(!spec.doc.is_empty(), "`{}` has no doc", spec.name);
        }
    }

    #[test]
    fn shared_options_come_first_so_every_list_starts_with_them() {
        let first_own = OPTIONS.iter().position(|spec| !spec.is_shared());
        let last_shared = OPTIONS.iter().rposition(|spec| spec.is_shared());
        assert!(last_shared < first_own, "{OPTIONS:#?}");
    }

    #[test]
    fn choice_words_map_to_their_variants_and_nothing_else() {
        fn check<C: Choice + std::fmt::Debug + PartialEq>() {
            for (index, word) in C::WORDS.iter().enumerate() {
                let variant = C::from_word(word).expect("a word of its own set");
                for other in &C::WORDS[index + 1..] {
                    assert_ne!(Some(variant), C::from_word(other), "{word} and {other}");
                }
            }
            assert_eq!(C::from_word("not a word"), None);
        }
        check::<Policy>();
        check::<Lost>();
        check::<Abandoned>();
        check::<StoreError>();
        check::<MissingKey>();
        check::<Scope>();
        check::<FlightScope>();
    }

    #[test]
    fn each_lease_option_is_a_positive_duration_its_attribute_takes() {
        for kind in Kind::ALL {
            if let Some(lease) = kind.lease_option() {
                assert!(lease.takes(kind), "{kind:?}");
                assert_eq!(lease.value, ValueKind::Duration { positive: true });
                assert!(
                    lease.default.is_some(),
                    "{kind:?}: renewal needs a lease length"
                );
            }
        }
    }

    /// One bullet of an option list in the rustdoc: its name, its head (between the first
    /// backticks) and its whole text.
    struct Bullet {
        name: String,
        head: String,
        text: String,
    }

    /// The bullets of the section of doc comment lines (with `prefix`, such as `///`) that
    /// starts at the heading `heading` in the lines starting at `from`.
    fn bullets(lines: &[&str], from: usize, prefix: &str, heading: &str) -> Vec<Bullet> {
        let docs: Vec<&str> = lines[from..]
            .iter()
            .map(|line| line.trim_start())
            .take_while(|line| line.starts_with(prefix))
            .map(|line| line[prefix.len()..].trim_start())
            .collect();
        let start = docs
            .iter()
            .position(|line| *line == heading)
            .unwrap_or_else(|| panic!("no `{heading}` section"));
        let mut found: Vec<Bullet> = Vec::new();
        for line in docs[start + 1..]
            .iter()
            .take_while(|line| !line.starts_with('#'))
        {
            if let Some(rest) = line.strip_prefix("* `") {
                let head = rest.split('`').next().unwrap_or_default().to_owned();
                let name = head
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                found.push(Bullet {
                    name,
                    head,
                    text: rest.to_owned(),
                });
            } else if let Some(last) = found.last_mut().filter(|_| !line.is_empty()) {
                last.text.push(' ');
                last.text.push_str(line);
            }
        }
        found
    }

    /// Checks one rustdoc option list against the table: the same options in the same order,
    /// a word-valued option's words in its head, and the table's default (or none) stated.
    fn check_list(found: &[Bullet], expected: &[&OptionSpec], what: &str) {
        let found_names: Vec<&str> = found.iter().map(|b| b.name.as_str()).collect();
        let expected_names: Vec<&str> = expected.iter().map(|spec| spec.name).collect();
        assert_eq!(
            found_names, expected_names,
            "the options documented on {what}"
        );
        for (bullet, spec) in found.iter().zip(expected) {
            if let ValueKind::Choice(words) = spec.value {
                let quoted: Vec<String> = words.iter().map(|w| format!("\"{w}\"")).collect();
                let head = format!("{} = {}", spec.name, quoted.join(" | "));
                assert_eq!(bullet.head, head, "the words of `{}` on {what}", spec.name);
            }
            match spec.default {
                Some(default) => assert!(
                    bullet.text.contains(&format!("Default `{default}`"))
                        || bullet.text.contains(&format!("Defaults to `{default}`")),
                    "`{}` on {what} does not state its default `{default}`: {}",
                    spec.name,
                    bullet.text
                ),
                None => assert!(
                    !bullet.text.contains("Default `") && !bullet.text.contains("Defaults to `"),
                    "`{}` on {what} states a default the table does not have: {}",
                    spec.name,
                    bullet.text
                ),
            }
        }
    }

    #[test]
    fn the_rustdoc_option_lists_match_the_table() {
        let source = include_str!("lib.rs");
        let lines: Vec<&str> = source.lines().collect();

        let shared: Vec<&OptionSpec> = OPTIONS.iter().copied().filter(|s| s.is_shared()).collect();
        let crate_docs = bullets(&lines, 0, "//!", "# Options every attribute takes");
        check_list(&crate_docs, &shared, "the crate");

        for kind in Kind::ALL {
            let own: Vec<&OptionSpec> = kind.options().filter(|s| !s.is_shared()).collect();
            let signature = format!("pub fn {}(", kind.name());
            let at = lines
                .iter()
                .position(|line| line.starts_with(&signature))
                .unwrap_or_else(|| panic!("no `{signature}` in lib.rs"));
            // The doc comment is the run of `///` lines above the attributes of the fn.
            let end = lines[..at]
                .iter()
                .rposition(|line| line.starts_with("///"))
                .unwrap_or(0);
            let start = lines[..=end]
                .iter()
                .rposition(|line| !line.starts_with("///"))
                .map_or(0, |i| i + 1);
            let found = bullets(&lines, start, "///", "# Options");
            check_list(&found, &own, &format!("#[{}]", kind.name()));
        }
    }
}
