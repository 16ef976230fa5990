//! Many waiters on one lock: what each acquisition costs in Redis commands, counted by the
//! server, so that a thundering herd (every waiter retrying on every release) or a per-waiter
//! subscription cannot creep back. A count, not a clock: it holds on a slow machine too.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use coord_core::provider::{LockProvider, OwnerToken, ReleaseOutcome};
use coord_redis::Client;
use coord_redis_testing::{Monitor, RedisServer};
use support::*;

per_client!(a_thousand_waiters_cost_at_most_five_commands_per_acquisition);

const WAITERS: usize = 1_000;
/// Providers, as separate processes would each have one.
const PROVIDERS: usize = 4;
/// Commands the clients send per acquisition (a script call counts once).
const SENT_PER_ACQUISITION: f64 = 5.0;
/// Commands Redis executes per acquisition (those inside scripts too): about 16 with the
/// hand-over (the release script takes the next waiter's entry off the queue and makes it the
/// holder, the waiter's look keeps the queue's expiry), against hundreds for a herd.
const EXECUTED_PER_ACQUISITION: f64 = 18.0;

/// Commands of the test's own connections, left out of the counts.
const OWN: [&str; 4] = ["config", "info", "echo", "monitor"];

async fn a_thousand_waiters_cost_at_most_five_commands_per_acquisition(client: Client) {
    let server = RedisServer::start();
    let mut providers = Vec::new();
    for _ in 0..PROVIDERS {
        providers.push(provider(&server, client).await);
    }
    let k = key("herd");
    // Connections and scripts warm, and the lock held while the waiters line up.
    for p in &providers {
        let me = OwnerToken::new();
        p.acquire(lock(&key("warm"), me, LONG, Duration::ZERO))
            .await
            .unwrap();
    }
    let holder = OwnerToken::new();
    assert!(
        providers[0]
            .acquire(lock(&k, holder, LONG, Duration::ZERO))
            .await
            .unwrap()
            .is_some()
    );
    let monitor = Monitor::start(&server);
    server.command(&["CONFIG", "RESETSTAT"]);
    monitor.drain();

    let holding = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..WAITERS)
        .map(|i| {
            let (p, k) = (providers[i % PROVIDERS].clone(), k.clone());
            let (holding, granted) = (holding.clone(), granted.clone());
            tokio::spawn(async move {
                let me = OwnerToken::new();
                let grant = p
                    .acquire(lock(&k, me, LONG, Duration::from_secs(600)))
                    .await
                    .expect("acquire")
                    .expect("granted within the wait");
                assert_eq!(
                    holding.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two holders at once"
                );
                assert!(grant.contended);
                tokio::task::yield_now().await;
                holding.fetch_sub(1, Ordering::SeqCst);
                granted.fetch_add(1, Ordering::SeqCst);
                assert_eq!(p.release(&k, me).await.unwrap(), ReleaseOutcome::Released);
            })
        })
        .collect();
    // Every waiter queued (first attempts and subscriptions made), then the hand-offs begin.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(granted.load(Ordering::SeqCst), 0);
    providers[0].release(&k, holder).await.unwrap();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(300), t)
            .await
            .expect("every waiter got the lock within 5 minutes")
            .unwrap();
    }
    // Let the last unsubscriptions land.
    until(
        "the waiters to unsubscribe",
        Duration::from_secs(10),
        || subscribers(&server, &redis_key(&k, "lock")) == 0,
    )
    .await;

    let mut sent = BTreeMap::<String, u64>::new();
    for c in monitor.client_commands() {
        *sent.entry(c).or_default() += 1;
    }
    let mut executed = server.command_calls();
    for own in OWN {
        sent.remove(own);
        executed.remove(own);
    }
    let per = |m: &BTreeMap<String, u64>| m.values().sum::<u64>() as f64 / WAITERS as f64;
    let (sent_per, executed_per) = (per(&sent), per(&executed));
    eprintln!(
        "{client:?}: {WAITERS} waiters over {PROVIDERS} providers: {sent_per:.2} commands sent \
         and {executed_per:.2} executed per acquisition; sent {sent:?}; executed {executed:?}"
    );
    assert!(
        sent_per <= SENT_PER_ACQUISITION,
        "{client:?}: {sent_per:.2} commands sent per acquisition (at most \
         {SENT_PER_ACQUISITION}): {sent:?}"
    );
    assert!(
        executed_per <= EXECUTED_PER_ACQUISITION,
        "{client:?}: {executed_per:.2} commands executed per acquisition (at most \
         {EXECUTED_PER_ACQUISITION}): {executed:?}"
    );
    // Each process subscribes once for the whole queue, not once per waiter.
    let subscribes = sent.get("subscribe").copied().unwrap_or(0);
    assert!(
        subscribes <= 2 * PROVIDERS as u64,
        "{client:?}: {subscribes} SUBSCRIBEs for {PROVIDERS} providers"
    );
}
