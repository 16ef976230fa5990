//! Tests of the whole expansion: stored snapshots, layer order, defaults and recovery from
//! bad input.
use super::*;

fn expand(kind: Kind, args: &str, item: &str) -> String {
    let args: TokenStream = args.parse().expect("test args lex");
    let item: TokenStream = item.parse().expect("test item lexes");
    expand_stack(kind, args, item).to_string()
}

fn position(haystack: &str, needle: &str) -> usize {
    haystack
        .find(needle)
        .unwrap_or_else(|| panic!("`{needle}` not in:\n{haystack}"))
}

/// Stacks whose whole expansion is compared with a stored copy, one per file under
/// `src/expand/snapshots/`. Between them they take every branch of the generator: each
/// layer alone and all four together, every cache scope, the cluster flight, no return
/// type, an `impl` return type, a method, a coordinator expression, a renamed crate,
/// inner attributes and taken-in sibling paths.
const SNAPSHOTS: [(&str, Kind, &str, &str); 16] = [
    (
        "idempotent_every_option",
        Kind::Idempotent,
        "key_from = [\"order.customer_id\", region], fingerprint = [\"order\", region], \
         retention = \"1h\", in_flight_lease = \"1m\", wait = \"2s\", \
         on_backend_error = fail_open, renew = \"15s\", on_lost = signal, \
         on_abandoned = fail, on_store_error = return_ok, \
         on_missing_key = run_unprotected, replica_acks = 1, replica_acks_timeout = \"500ms\", \
         name = \"payments.charge\", record_key = true, \
         profile = \"payments\", coordinator = \"&self.coordinator\"",
        "/// Charges. \n #[inline] pub async fn charge(&self, order: Order, region: String) \
         -> Result<u64, PaymentError> { #![allow(unused)] Ok(order.cents) }",
    ),
    (
        "every_layer",
        Kind::DistributedLock,
        "lease = \"5m\", wait = \"1s\", fenced = true, renew = true",
        "#[coord_core::cached(ttl = \"30s\", scope = two_tier, cache_err = true, \
         max_capacity = 500)] #[single_flight] #[idempotent(key_from = \"id\")] \
         async fn f(id: u64) -> Result<u64, E> { Ok(id) }",
    ),
    (
        "cached_local",
        Kind::Cached,
        "key_from = \"self.id\", ttl = \"1m\"",
        "async fn quote(self: Arc<Self>) -> Result<u64, String> { Ok(self.id) }",
    ),
    (
        "cached_shared",
        Kind::Cached,
        "key_from = symbol, ttl = \"10s\", scope = \"shared\", crate = \"coord\"",
        "async fn quote(symbol: String) -> Result<u64, String> { Ok(symbol.len() as u64) }",
    ),
    (
        "cached_two_tier_local_ttl",
        Kind::Cached,
        "ttl = \"10s\", scope = two_tier, local_ttl = \"2s\"",
        "async fn quote() -> Result<u64, String> { Ok(1) }",
    ),
    (
        "single_flight_process_no_return_type",
        Kind::SingleFlight,
        "",
        "async fn warm() { }",
    ),
    (
        "single_flight_impl_return_type",
        Kind::SingleFlight,
        "key_from = \"id\"",
        "async fn f(id: u64) -> impl Clone + Send + 'static { id }",
    ),
    (
        "single_flight_cluster",
        Kind::SingleFlight,
        "key_from = \"id\", scope = cluster, lease = \"3s\"",
        "#[coord_core::distributed_lock(on_backend_error = \"fail_closed\", renew = \"5s\", \
         on_lost = signal)] async fn f(id: u64) -> Result<u64, E> { Ok(id) }",
    ),
    (
        "single_flight_cluster_replica_acks",
        Kind::SingleFlight,
        "key_from = \"id\", scope = cluster, replica_acks = 2, replica_acks_timeout = \"750ms\"",
        "async fn f(id: u64) -> Result<u64, E> { Ok(id) }",
    ),
    (
        "single_flight_cluster_impl_return_type",
        Kind::SingleFlight,
        "scope = cluster",
        "async fn f() -> Result<impl Serialize, E> { Ok(1) }",
    ),
    (
        "lock_defaults",
        Kind::DistributedLock,
        "",
        "async fn rebuild(&mut self) -> Result<(), CoordError> { Ok(()) }",
    ),
    (
        "idempotent_in_transaction",
        Kind::Idempotent,
        "key_from = \"order_id\", fingerprint = \"cents\", transaction = \"tx\", renew = true",
        "async fn charge(&self, tx: &mut Transaction<'_>, order_id: String, cents: u64) \
         -> Result<u64, E> { tx.insert(&order_id, cents).await }",
    ),
    (
        "idempotent_in_transaction_with_lock",
        Kind::DistributedLock,
        "lease = \"10s\"",
        "#[idempotent(key_from = id, transaction = tx)] \
         async fn f(mut tx: &mut dyn OutcomeTransaction, id: u64) -> Result<u64, E> { Ok(id) }",
    ),
    (
        "rw_lock_read",
        Kind::DistributedLock,
        "key_from = book, mode = \"read\", wait = \"5s\", renew = true, replica_acks = 0",
        "async fn prices(book: u64) -> Result<(), E> { Ok(()) }",
    ),
    (
        "semaphore",
        Kind::DistributedLock,
        "key_from = tenant, permits = 5, lease = \"1m\", wait = \"10s\", renew = true",
        "async fn export(tenant: u64) -> Result<(), E> { Ok(()) }",
    ),
    (
        "multi_lock",
        Kind::DistributedLock,
        "key_from_each = accounts, lease = \"1m\", wait = \"5s\", renew = true",
        "async fn transfer(accounts: Vec<u64>, cents: u64) -> Result<u64, E> { Ok(cents) }",
    ),
];

/// The expansion, one statement a line, so that a difference reads as a diff.
fn readable(expansion: &str) -> String {
    let mut lines = expansion.replace("; ", ";\n");
    lines.push('\n');
    lines
}

/// The generated code changes only on purpose: each stack's expansion is the stored one.
/// After a deliberate change, run the tests with `COORD_MACROS_BLESS=1` to store the new
/// expansions, and review their diff.
#[test]
fn expansions_match_their_snapshots() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/expand/snapshots");
    let bless = std::env::var_os("COORD_MACROS_BLESS").is_some();
    let mut stale = Vec::new();
    for (name, kind, args, item) in SNAPSHOTS {
        let out = readable(&expand(kind, args, item));
        assert!(!out.contains("compile_error"), "{name}: {out}");
        let file = dir.join(format!("{name}.txt"));
        if bless {
            std::fs::create_dir_all(&dir).expect("create the snapshot directory");
            std::fs::write(&file, &out).expect("write a snapshot");
            continue;
        }
        let stored = std::fs::read_to_string(&file)
            .unwrap_or_else(|err| panic!("{}: {err}", file.display()));
        if stored != out {
            stale.push(format!("{name}:\n--- stored\n{stored}\n+++ now\n{out}"));
        }
    }
    assert!(
        stale.is_empty(),
        "expansions changed:\n{}",
        stale.join("\n")
    );
}

#[test]
fn layers_nest_in_canonical_order_whatever_the_written_order() {
    let out = expand(
        Kind::DistributedLock,
        "lease = \"5m\"",
        "#[single_flight] #[coord_core::idempotent(key_from = \"id\")] \
         async fn f(id: u64) -> Result<u64, E> { Ok(id) }",
    );
    let idem = position(&out, ":: idempotent (");
    let flight = position(&out, ":: single_flight (");
    let lock = position(&out, ":: distributed_lock (");
    assert!(idem < flight && flight < lock, "{out}");
    assert!(!out.contains("# [single_flight]"), "{out}");
    assert!(out.contains("from_millis (300000u64)"), "{out}");
    assert!(!out.contains("compile_error"), "{out}");
}

#[test]
fn the_cache_sits_between_idempotency_and_single_flight_in_every_written_order() {
    let layers = [
        "#[idempotent(key_from = \"id\")]",
        "#[cached(ttl = \"1m\")]",
        "#[single_flight]",
        "#[distributed_lock]",
    ];
    // Every rotation and its reverse: each attribute is written first, last and between.
    for start in 0..layers.len() {
        for reverse in [false, true] {
            let mut order: Vec<&str> = (0..layers.len())
                .map(|i| layers[(start + i) % layers.len()])
                .collect();
            if reverse {
                order.reverse();
            }
            let (first, rest) = order.split_first().expect("four layers");
            let (name, args) = first
                .trim_start_matches("#[")
                .trim_end_matches(']')
                .split_once('(')
                .map_or(
                    (first.trim_start_matches("#[").trim_end_matches(']'), ""),
                    |(n, a)| (n, a.trim_end_matches(')')),
                );
            let kind = Kind::from_name(name).expect("a coord attribute");
            let item = format!(
                "{} async fn f(id: u64) -> Result<u64, E> {{ Ok(id) }}",
                rest.join(" ")
            );
            let out = expand(kind, args, &item);
            assert!(!out.contains("compile_error"), "{order:?}: {out}");
            let idem = position(&out, ":: idempotent (");
            let cache = position(&out, ":: cached (");
            let flight = position(&out, ":: single_flight (");
            let lock = position(&out, ":: distributed_lock (");
            assert!(
                idem < cache && cache < flight && flight < lock,
                "{order:?}: {out}"
            );
            assert!(out.contains(":: local_form ()"), "{out}");
        }
    }
}

#[test]
fn the_scope_picks_the_form_that_checks_the_output() {
    let item = "async fn f(id: u64) -> Result<u64, E> { Ok(id) }";
    let out = expand(Kind::Cached, "ttl = \"1s\", scope = \"shared\"", item);
    assert!(out.contains(":: shared_form ()"), "{out}");
    let out = expand(
        Kind::Cached,
        "ttl = \"1s\", scope = two_tier, cache_err = true",
        item,
    );
    assert!(out.contains(":: shared_result_form ()"), "{out}");
    // A tenth of the TTL is the two-tier default local TTL.
    assert!(out.contains("from_millis (100u64)"), "{out}");
}

#[test]
fn foreign_attributes_stay_in_their_order() {
    let out = expand(
        Kind::SingleFlight,
        "",
        "/// Docs. \n #[inline] #[distributed_lock] #[cfg(all())] #[allow(dead_code)] \
         pub async fn f() -> Result<(), E> { Ok(()) }",
    );
    let doc = position(&out, "doc =");
    let inline = position(&out, "# [inline]");
    let cfg = position(&out, "# [cfg (all ())]");
    let allow = position(&out, "# [allow (dead_code)]");
    assert!(doc < inline && inline < cfg && cfg < allow, "{out}");
    assert!(out.starts_with("# [doc"), "{out}");
    assert!(out.contains("pub async fn f ()"), "{out}");
}

#[test]
fn errors_keep_the_function_and_drop_the_taken_in_attributes() {
    let out = expand(
        Kind::Idempotent,
        "",
        "#[distributed_lock(lease = \"soon\")] async fn f(id: u64) -> Result<(), E> { Ok(()) }",
    );
    assert_eq!(out.matches("compile_error").count(), 2, "{out}");
    assert!(out.contains("async fn f (id : u64)"), "{out}");
    assert!(!out.contains("# [distributed_lock"), "{out}");
    assert!(!out.contains(MARKER), "{out}");
}

#[test]
fn a_second_expansion_is_refused() {
    let once = expand(
        Kind::DistributedLock,
        "",
        "async fn f() -> Result<(), E> { Ok(()) }",
    );
    let twice = expand(Kind::Idempotent, "key_from = \"x\"", &once);
    assert!(twice.contains("compile_error"), "{twice}");
    assert!(twice.contains("was not taken in"), "{twice}");
}

#[test]
fn odd_input_gives_errors_not_panics() {
    let item = "async fn f(id: u64, (a, b): (u8, u8), s: S) -> Result<(), E> { Ok(()) }";
    for args in [
        "key_from",
        "key_from =",
        "= 3",
        "key_from = [1, 2]",
        "key_from = []",
        "key_from = \"\"",
        "key_from = \"a..b\"",
        "key_from = \"0\"",
        "key_from = \"r#type\"",
        "key_from = \"fn\"",
        "key_from = \"self\"",
        "key_from = id()",
        "key_from = \"id\" lease",
        "crate = 5",
        "crate = \"::\"",
        "name = \"\u{e9}\"",
        "name = \"\"",
        "name = 5",
        "coordinator = \"(\"",
        "coordinator = \"\"",
        "lease = 5",
        "lease = \"0s\"",
        "lease = \"99999999999999999999999h\"",
        "fenced = 1",
        "on_backend_error = 3",
        "on_backend_error = fail_open, on_backend_error = \"x\"",
        "renew = \"10s\", on_lost = \"abort\"",
        "key_from = \"id\",,",
        "(key_from = \"id\")",
    ] {
        for kind in Kind::ALL {
            let out = expand(kind, args, item);
            assert!(out.contains("compile_error"), "{kind:?} {args}: {out}");
            assert!(out.contains("async fn f"), "{kind:?} {args}: {out}");
        }
    }
}

#[test]
fn bare_and_tuple_field_paths_are_accepted() {
    let item = "async fn f(id: (u64, u8), s: S) -> Result<(), E> { Ok(()) }";
    for args in [
        "key_from = \"s.0\"",
        "key_from = id.0",
        "key_from = [s.name, \"id\"]",
    ] {
        let out = expand(Kind::DistributedLock, args, item);
        assert!(!out.contains("compile_error"), "{args}: {out}");
    }
}

#[test]
fn non_functions_are_passed_through_with_an_error() {
    let out = expand(Kind::SingleFlight, "", "struct S;");
    assert!(out.contains("compile_error"), "{out}");
    assert!(out.contains("struct S ;"), "{out}");
    let out = expand(Kind::SingleFlight, "", "async fn f(&self);");
    assert!(out.contains("compile_error"), "{out}");
}

#[test]
fn a_half_typed_body_gets_the_parse_error_and_comes_back_as_written() {
    let out = expand(
        Kind::DistributedLock,
        "lease = \"soon\"",
        "#[coord_core::single_flight] async fn f(id: u64) -> Result<u64, E> { \
         #![allow(unused)] let doubled = id * 2 Ok(doubled) }",
    );
    assert!(!out.contains("goes on an `async fn` with a body"), "{out}");
    assert!(out.contains("expected `;`"), "{out}");
    assert!(out.contains("invalid duration"), "{out}");
    // The body as written, the taken-in attribute named after its inner attributes.
    assert!(
        out.contains(
            "{ #! [allow (unused)] # [allow (unused_imports)] use coord_core :: single_flight as _ ; \
             let doubled = id * 2 Ok (doubled) }"
        ),
        "{out}"
    );
    assert!(!out.contains("# [coord_core :: single_flight]"), "{out}");
    assert!(!out.contains(MARKER), "{out}");
}

#[test]
fn a_half_typed_signature_gets_the_parse_error() {
    let out = expand(
        Kind::SingleFlight,
        "",
        "async fn f(id: u64,, x: u8) -> Result<u64, E> { Ok(id) }",
    );
    assert!(!out.contains("goes on an `async fn` with a body"), "{out}");
    assert!(out.contains("compile_error"), "{out}");
    assert!(out.contains("{ Ok (id) }"), "{out}");
}

#[test]
fn a_non_function_reports_its_arguments_and_keeps_the_other_attributes() {
    let out = expand(
        Kind::Idempotent,
        "retention = \"forever\"",
        "#[single_flight] struct S;",
    );
    assert!(out.contains("invalid duration"), "{out}");
    assert!(out.contains("goes on an `async fn` with a body"), "{out}");
    assert!(out.contains("# [single_flight] struct S ;"), "{out}");
}

#[test]
fn options_left_out_take_the_table_defaults() {
    let out = expand(
        Kind::Idempotent,
        "key_from = \"id\"",
        "#[distributed_lock] async fn f(id: u64) -> Result<(), E> { Ok(()) }",
    );
    // One field of the `IdempotencySpec` or the `LockSpec`, as rendered.
    let field = |spec: &str, name: &str| {
        let section = &out[position(&out, &format!("{spec} {{"))..];
        let at = position(section, &format!(" {name} :"));
        section[at..]
            .split(',')
            .next()
            .unwrap_or_default()
            .trim()
            .to_owned()
    };
    let idem = |name: &str| field("IdempotencySpec", name);
    let lock = |name: &str| field("LockSpec", name);
    assert!(
        idem("retention").ends_with("from_millis (86400000u64)"),
        "{out}"
    );
    assert!(
        idem("in_flight_lease").ends_with("from_millis (30000u64)"),
        "{out}"
    );
    assert!(idem("wait").ends_with("from_millis (0u64)"), "{out}");
    assert!(idem("renew").ends_with("None"), "{out}");
    assert!(idem("on_lost").ends_with("None"), "{out}");
    assert!(idem("on_backend_error").ends_with("None"), "{out}");
    assert!(
        idem("on_abandoned").ends_with("OnAbandoned :: Rerun"),
        "{out}"
    );
    assert!(
        idem("on_store_error").ends_with("OnStoreError :: Error"),
        "{out}"
    );
    assert!(
        idem("on_missing_key").ends_with("OnMissingKey :: Fail"),
        "{out}"
    );
    assert!(lock("lease").ends_with("from_millis (30000u64)"), "{out}");
    assert!(lock("wait").ends_with("from_millis (0u64)"), "{out}");
    assert_eq!(lock("fenced"), "fenced : false", "{out}");
    assert!(lock("renew").ends_with("None"), "{out}");
    assert!(lock("on_lost").ends_with("None"), "{out}");
}

#[test]
fn written_options_override_the_defaults() {
    let out = expand(
        Kind::Idempotent,
        "key_from = \"id\", retention = \"1h\", on_abandoned = fail, \
         on_store_error = \"return_ok\", on_missing_key = \"run_unprotected\", renew = true",
        "async fn f(id: Option<u64>) -> Result<(), E> { Ok(()) }",
    );
    assert!(
        out.contains(
            "retention : :: coord_core :: __private :: Duration :: from_millis (3600000u64)"
        ),
        "{out}"
    );
    assert!(out.contains("OnAbandoned :: Fail"), "{out}");
    assert!(out.contains("OnStoreError :: ReturnOk"), "{out}");
    assert!(out.contains("OnMissingKey :: RunUnprotected"), "{out}");
    // `renew = true`: every third of the in-flight lease, and `on_lost` becomes `cancel`.
    assert!(out.contains("from_millis (10000u64)"), "{out}");
    assert!(out.contains("OnLost :: Cancel"), "{out}");
}

#[test]
fn key_parts_follow_key_from_and_fingerprint_is_optional() {
    let out = expand(
        Kind::Idempotent,
        "key_from = [\"order.customer_id\", region], fingerprint = [\"order\"]",
        "async fn f(order: Order, region: String) -> Result<(), E> { Ok(()) }",
    );
    assert!(
        out.contains(
            ". named_part (\"order.customer_id\" , & order . customer_id) . named_part (\"region\" , & region)"
        ),
        "{out}"
    );
    assert!(out.contains(". param (& order) . finish ()"), "{out}");

    let out = expand(
        Kind::Idempotent,
        "key_from = \"id\"",
        "async fn f(id: u64) -> Result<(), E> { Ok(()) }",
    );
    assert!(
        out.contains("let __coord_fingerprint = :: core :: option :: Option :: None"),
        "{out}"
    );
}

#[test]
fn cluster_scope_adds_the_cluster_step_with_its_lease_and_error_probe() {
    let item = "async fn f(id: u64) -> Result<u64, E> { Ok(id) }";
    let out = expand(Kind::SingleFlight, "scope = \"cluster\"", item);
    assert!(out.contains(":: cluster_single_flight ("), "{out}");
    assert!(out.contains("from_millis (10000u64)"), "{out}");
    assert!(
        out.contains(":: FlightProbe :: < Result < u64 , E > > :: new ()"),
        "{out}"
    );
    let out = expand(Kind::SingleFlight, "scope = cluster, lease = \"3s\"", item);
    assert!(out.contains("from_millis (3000u64)"), "{out}");
    let out = expand(Kind::SingleFlight, "", item);
    assert!(!out.contains("cluster_single_flight"), "{out}");
    assert!(out.contains(":: single_flight ("), "{out}");
    let out = expand(Kind::SingleFlight, "lease = \"3s\"", item);
    assert!(out.contains("compile_error"), "{out}");
}

#[test]
fn a_field_of_a_shared_self_is_borrowed_and_anything_else_owned() {
    let borrowed = [
        (
            "coordinator = self.coord",
            "async fn f(&self, id: u64) -> Result<(), E> { Ok(()) }",
        ),
        (
            "coordinator = self.inner.coord",
            "async fn f(&'a self, id: u64) -> Result<(), E> { Ok(()) }",
        ),
    ];
    for (args, item) in borrowed {
        let out = expand(
            Kind::DistributedLock,
            &format!("key_from = \"id\", {args}"),
            item,
        );
        assert!(out.contains("borrow_coordinator"), "{args} {item}: {out}");
        assert!(!out.contains("own_coordinator"), "{args} {item}: {out}");
    }
    let owned = [
        // The body may take `self` by value, or mutably.
        (
            "coordinator = self.coord",
            "async fn f(self, id: u64) -> Result<(), E> { Ok(()) }",
        ),
        (
            "coordinator = self.coord",
            "async fn f(&mut self, id: u64) -> Result<(), E> { Ok(()) }",
        ),
        (
            "coordinator = self.coord",
            "async fn f(self: Arc<Self>, id: u64) -> Result<(), E> { Ok(()) }",
        ),
        // Not a field of `self`: a parameter, a call, a reference.
        (
            "coordinator = c",
            "async fn f(&self, c: Coordinator, id: u64) -> Result<(), E> { Ok(()) }",
        ),
        (
            "coordinator = self.coord()",
            "async fn f(&self, id: u64) -> Result<(), E> { Ok(()) }",
        ),
        (
            "coordinator = &self.coord",
            "async fn f(&self, id: u64) -> Result<(), E> { Ok(()) }",
        ),
        (
            "coordinator = self.0",
            "async fn f(&self, id: u64) -> Result<(), E> { Ok(()) }",
        ),
    ];
    for (args, item) in owned {
        let out = expand(
            Kind::DistributedLock,
            &format!("key_from = \"id\", {args}"),
            item,
        );
        assert!(out.contains("own_coordinator"), "{args} {item}: {out}");
        assert!(!out.contains("borrow_coordinator"), "{args} {item}: {out}");
    }
}
