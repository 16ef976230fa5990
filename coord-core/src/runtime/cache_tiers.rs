//! What the `#[cached]` layer keeps, and where: the scopes, an operation's cache spec, the
//! output bounds the macros check, and the local tiers of this process (with invalidation).
//! The layer itself, which runs inside a call, is `cache.rs`.
//!
//! Two tiers, chosen by the operation's scope:
//!
//! * the **local** tier, a bounded moka cache per operation in this process, found through the
//!   operation's static spec (like its metric keys), keyed by the call key;
//! * the **shared** tier, the provider's [`CacheStore`](crate::provider::CacheStore), seen by every
//!   process sharing the provider, holding values encoded with the coordinator's codec.
//!
//! `two_tier` reads the local tier first, then the shared one, and keeps what it read from the
//! shared tier locally for at most `local_ttl` and never past the shared entry's own expiry.
//!
//! Nothing here turns into an error for the caller: a shared read that fails is a miss
//! (counted as `error`), an entry that does not decode is a miss (counted as `stale`, with a
//! warning), and a write that fails is logged and counted.

use std::any::{Any, TypeId};
use std::sync::{Arc, LazyLock, Mutex, OnceLock};
use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::codec::Codec;
use crate::provider::CallKey;

/// Where a `#[cached]` operation keeps its entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheScope {
    /// In this process only: a bounded in-memory cache per operation. The default.
    Local,
    /// In the provider, so every process sharing it sees one entry (for Redis, one key).
    Shared,
    /// A local tier in front of the shared one: local entries live at most `local_ttl`.
    TwoTier,
}

impl CacheScope {
    pub(crate) fn has_local(self) -> bool {
        matches!(self, CacheScope::Local | CacheScope::TwoTier)
    }

    pub(crate) fn has_shared(self) -> bool {
        matches!(self, CacheScope::Shared | CacheScope::TwoTier)
    }
}

/// `#[cached]` options, resolved at compile time (or by the handle API at run time).
#[derive(Debug)]
pub struct CacheSpec {
    /// How long an entry is served.
    pub ttl: Duration,
    /// Where entries are kept.
    pub scope: CacheScope,
    /// How long a `two_tier` operation keeps an entry locally (capped at `ttl`); ignored by the
    /// other scopes.
    pub local_ttl: Duration,
    /// How many entries the local tier holds at most (moka's bound: it may be exceeded briefly).
    pub max_capacity: u64,
    /// Whether `Err` outcomes are cached too.
    pub cache_err: bool,
    /// The operation's local tier, made on first use.
    pub local: LocalSlot,
}

impl CacheSpec {
    /// How long an entry this call writes stays in the local tier.
    pub(crate) fn local_ttl(&self) -> Duration {
        match self.scope {
            CacheScope::TwoTier => self.local_ttl.min(self.ttl),
            _ => self.ttl,
        }
    }
}

/// Where an operation's local tier is kept once made (in its static spec).
#[derive(Default)]
pub struct LocalSlot(OnceLock<Arc<dyn ErasedTier>>);

impl LocalSlot {
    /// Empty: the tier is made on the first call.
    pub const fn new() -> LocalSlot {
        LocalSlot(OnceLock::new())
    }
}

impl std::fmt::Debug for LocalSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LocalSlot")
    }
}

/// The output of a `#[cached]` function: a `Result` whose values can be kept in memory and
/// handed out as clones. Success is decided by matching `Ok(_)`.
#[diagnostic::on_unimplemented(
    message = "`#[cached]` keeps the outcome and hands out clones: the function must return `Result<T, E>` with `T` and `E` both `Clone + Send + Sync + 'static`; `{Self}` is not such a type",
    label = "this return type cannot be cached",
    note = "wrap a value that is not `Clone` in an `Arc`, or return an owned type instead of a borrowed one"
)]
pub trait CacheOutput: Clone + Send + Sync + 'static {
    /// True for `Ok(_)`.
    fn is_ok(&self) -> bool;
}

impl<T, E> CacheOutput for Result<T, E>
where
    T: Clone + Send + Sync + 'static,
    E: Clone + Send + Sync + 'static,
{
    fn is_ok(&self) -> bool {
        Result::is_ok(self)
    }
}

/// An output whose `Ok` value the shared tier can store with the coordinator's codec.
#[diagnostic::on_unimplemented(
    message = "`#[cached(scope = \"shared\" | \"two_tier\")]` stores the `Ok` value with the coordinator's codec: `{Self}` must be `Result<T, E>` with `T: serde::Serialize + serde::de::DeserializeOwned`",
    label = "this return type cannot be stored in the shared cache",
    note = "derive `Serialize` and `Deserialize` for the value, or use `scope = \"local\"`"
)]
pub trait SharedOutput: CacheOutput {
    /// Encodes the value to store (`None`: an `Err`, not stored by this form).
    fn encode(&self, codec: Codec) -> Option<Result<Vec<u8>, String>>;
    /// Decodes a stored value.
    fn decode(bytes: &[u8], codec: Codec) -> Result<Self, String>;
}

impl<T, E> SharedOutput for Result<T, E>
where
    Result<T, E>: CacheOutput,
    T: Serialize + DeserializeOwned,
{
    fn encode(&self, codec: Codec) -> Option<Result<Vec<u8>, String>> {
        self.as_ref().ok().map(|ok| codec.encode_checked(ok))
    }

    fn decode(bytes: &[u8], codec: Codec) -> Result<Self, String> {
        codec.decode::<T>(bytes).map(Ok)
    }
}

/// An output the shared tier can store whole, `Err` included (`cache_err = true`).
#[diagnostic::on_unimplemented(
    message = "`#[cached(cache_err = true)]` in a shared scope stores errors too: `{Self}` must be `Result<T, E>` with both `T` and `E` `serde::Serialize + serde::de::DeserializeOwned`",
    label = "this return type cannot be stored whole in the shared cache",
    note = "derive `Serialize` and `Deserialize` for the error type, leave out `cache_err`, or use `scope = \"local\"`"
)]
pub trait SharedResultOutput: CacheOutput {
    /// Encodes the whole outcome.
    fn encode_whole(&self, codec: Codec) -> Result<Vec<u8>, String>;
    /// Decodes a stored outcome.
    fn decode_whole(bytes: &[u8], codec: Codec) -> Result<Self, String>;
}

impl<T, E> SharedResultOutput for Result<T, E>
where
    Result<T, E>: CacheOutput,
    T: Serialize + DeserializeOwned,
    E: Serialize + DeserializeOwned,
{
    fn encode_whole(&self, codec: Codec) -> Result<Vec<u8>, String> {
        codec.encode_checked(self)
    }

    fn decode_whole(bytes: &[u8], codec: Codec) -> Result<Self, String> {
        codec.decode::<Self>(bytes)
    }
}

type Encode<R> = fn(&R, Codec) -> Option<Result<Vec<u8>, String>>;
type Decode<R> = fn(&[u8], Codec) -> Result<R, String>;

/// How an operation's outcomes go to and from the shared tier; the macros pick it from the
/// scope and `cache_err`, which is what checks the output type's bounds at compile time.
pub struct CacheForm<R> {
    pub(crate) encode: Option<Encode<R>>,
    pub(crate) decode: Option<Decode<R>>,
}

/// The form of a `local` operation: nothing is encoded.
pub const fn local_form<R: CacheOutput>() -> CacheForm<R> {
    CacheForm {
        encode: None,
        decode: None,
    }
}

/// The form of a shared operation caching `Ok` only.
pub const fn shared_form<R: SharedOutput>() -> CacheForm<R> {
    CacheForm {
        encode: Some(R::encode),
        decode: Some(R::decode),
    }
}

/// The form of a shared operation with `cache_err = true`.
pub const fn shared_result_form<R: SharedResultOutput>() -> CacheForm<R> {
    fn encode<R: SharedResultOutput>(value: &R, codec: Codec) -> Option<Result<Vec<u8>, String>> {
        Some(value.encode_whole(codec))
    }
    CacheForm {
        encode: Some(encode::<R>),
        decode: Some(R::decode_whole),
    }
}

/// A local entry and how long it may live.
#[derive(Clone)]
pub(crate) struct Timed<R> {
    value: R,
    ttl: Duration,
}

struct TimedExpiry;

impl<R> moka::Expiry<CallKey, Timed<R>> for TimedExpiry {
    fn expire_after_create(
        &self,
        _key: &CallKey,
        value: &Timed<R>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(value.ttl)
    }

    fn expire_after_update(
        &self,
        _key: &CallKey,
        value: &Timed<R>,
        _updated_at: std::time::Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        Some(value.ttl)
    }
}

/// One operation's local tier.
pub(crate) struct LocalTier<R: CacheOutput> {
    entries: moka::sync::Cache<CallKey, Timed<R>>,
}

impl<R: CacheOutput> LocalTier<R> {
    fn new(max_capacity: u64) -> LocalTier<R> {
        LocalTier {
            entries: moka::sync::Cache::builder()
                .max_capacity(max_capacity)
                .expire_after(TimedExpiry)
                .build(),
        }
    }

    pub(crate) fn get(&self, key: &CallKey) -> Option<R> {
        self.entries.get(key).map(|timed| timed.value)
    }

    pub(crate) fn insert(&self, key: CallKey, value: R, ttl: Duration) {
        if !ttl.is_zero() {
            self.entries.insert(key, Timed { value, ttl });
        }
    }
}

/// A local tier of any output type, as the registry sees it.
pub(crate) trait ErasedTier: Any + Send + Sync {
    fn invalidate(&self, key: &CallKey) -> bool;
    fn output_type(&self) -> TypeId;
    fn as_any(&self) -> &dyn Any;
}

impl<R: CacheOutput> ErasedTier for LocalTier<R> {
    fn invalidate(&self, key: &CallKey) -> bool {
        self.entries.remove(key).is_some()
    }

    fn output_type(&self) -> TypeId {
        TypeId::of::<R>()
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Every local tier made in this process, by operation name, so that
/// [`Coordinator::invalidate`](crate::Coordinator::invalidate) finds them from a key, and run
/// time specs (the handle API) with the same operation and output share one tier.
static TIERS: LazyLock<Mutex<Vec<NamedTier>>> = LazyLock::new(|| Mutex::new(Vec::new()));

/// A local tier and the operation it belongs to.
type NamedTier = (String, Arc<dyn ErasedTier>);

pub(crate) fn tier_for<R: CacheOutput>(op: &str, spec: &CacheSpec) -> Arc<dyn ErasedTier> {
    spec.local
        .0
        .get_or_init(|| {
            let mut tiers = TIERS.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((_, tier)) = tiers
                .iter()
                .find(|(name, tier)| name == op && tier.output_type() == TypeId::of::<R>())
            {
                return tier.clone();
            }
            let tier: Arc<dyn ErasedTier> = Arc::new(LocalTier::<R>::new(spec.max_capacity));
            tiers.push((op.to_owned(), tier.clone()));
            tier
        })
        .clone()
}

/// Removes `key` from every local tier of its operation in this process; true if an entry was
/// there.
pub(crate) fn invalidate_local(key: &CallKey) -> bool {
    let Some(op) = key.operation() else {
        return false;
    };
    let tiers: Vec<Arc<dyn ErasedTier>> = TIERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(name, _)| name == op)
        .map(|(_, tier)| tier.clone())
        .collect();
    let mut found = false;
    for tier in tiers {
        found |= tier.invalidate(key);
    }
    found
}
