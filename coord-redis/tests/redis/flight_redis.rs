//! Cluster-scope single-flight against a real redis-server, for every client: the layout in
//! Redis, followers that lose their subscriber connection, hand-overs that do not decode, and
//! values coord did not write.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::{BackendErrorKind, FlightClaim, FlightStore, FlightWait, OwnerToken};
use coord_core::{CoordError, Coordinator};
use coord_redis::Client;
use coord_redis_testing::{RedisServer, Resp};
use support::*;

per_client!(
    claim_and_hand_over_live_where_the_layout_says,
    a_follower_whose_subscriber_dropped_still_gets_the_outcome,
    an_undecodable_hand_over_is_a_codec_error_not_a_value,
    a_claim_coord_did_not_write_is_corrupt,
);

async fn claim_and_hand_over_live_where_the_layout_says(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("layout");
    let a = OwnerToken::new();
    assert_eq!(
        p.flight_claim(&k, a, LONG).await.unwrap(),
        FlightClaim::Claimed
    );
    let claim = redis_key(&k, "flight");
    assert_eq!(
        server.command(&["GET", &claim]),
        Resp::Bulk(a.to_string().into_bytes())
    );
    let pttl = server.command(&["PTTL", &claim]).int().unwrap();
    assert!(pttl > 20_000 && pttl <= 30_000, "the claim's lease: {pttl}");
    assert!(
        p.flight_finish(&k, a, b"bytes", Duration::from_secs(5))
            .await
            .unwrap()
    );
    assert_eq!(server.command(&["EXISTS", &claim]).int(), Some(0));
    let kept = format!("{claim}:{a}");
    assert_eq!(
        server.command(&["GET", &kept]),
        Resp::Bulk(b"bytes".to_vec())
    );
    let pttl = server.command(&["PTTL", &kept]).int().unwrap();
    assert!(
        pttl > 0 && pttl <= 5_000,
        "kept for the hand-over only: {pttl}"
    );
}

async fn a_follower_whose_subscriber_dropped_still_gets_the_outcome(client: Client) {
    let server = RedisServer::start();
    let leader = provider(&server, client).await;
    let follower = Arc::new(provider(&server, client).await);
    let k = key("resync");
    let a = OwnerToken::new();
    assert_eq!(
        leader.flight_claim(&k, a, LONG).await.unwrap(),
        FlightClaim::Claimed
    );
    let waiting = {
        let (follower, k) = (follower.clone(), k.clone());
        tokio::spawn(async move {
            let started = Instant::now();
            (
                follower.flight_wait(&k, a, LONG).await.unwrap(),
                started.elapsed(),
            )
        })
    };
    let channel = redis_key(&k, "flight");
    let subscribed = || match server.command(&["PUBSUB", "NUMSUB", &channel]) {
        Resp::Array(items) => items.get(1).and_then(Resp::int) == Some(1),
        _ => false,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !subscribed() {
        assert!(Instant::now() < deadline, "the follower never subscribed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The subscriber connection drops, and the leader finishes while it is gone: the message
    // is lost, and only the read after the reconnection can find the outcome.
    server.command(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert!(leader.flight_finish(&k, a, b"outcome", LONG).await.unwrap());
    let (got, waited) = waiting.await.unwrap();
    assert_eq!(got, FlightWait::Finished(b"outcome".to_vec()));
    assert!(
        waited < Duration::from_secs(20),
        "found on reconnection, not at the 30 s lease: {waited:?}"
    );
}

#[coord_core::single_flight(key_from = "part", scope = "cluster", coordinator = c, name = "flight.decode")]
async fn decode_me(c: &Coordinator, part: &str, runs: Arc<AtomicUsize>) -> Result<u64, CoordError> {
    runs.fetch_add(1, Ordering::SeqCst);
    Ok(1)
}

async fn an_undecodable_hand_over_is_a_codec_error_not_a_value(client: Client) {
    let server = RedisServer::start();
    let c = Coordinator::builder()
        .namespace("decode")
        .provider(provider(&server, client).await)
        .build()
        .unwrap();
    let k = c.key("flight.decode").part("x").finish();
    // A leader of another build holds the flight and hands over bytes this build cannot read.
    let other = OwnerToken::new();
    assert_eq!(
        c.flight_store()
            .flight_claim(&k, other, LONG)
            .await
            .unwrap(),
        FlightClaim::Claimed
    );
    let runs = Arc::new(AtomicUsize::new(0));
    let follower = {
        let (c, runs) = (c.clone(), runs.clone());
        tokio::spawn(async move { decode_me(&c, "x", runs).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        c.flight_store()
            .flight_finish(&k, other, b"\x09not a hand-over", LONG)
            .await
            .unwrap()
    );
    match follower.await.unwrap() {
        Err(CoordError::Codec { key, .. }) => assert_eq!(key, k),
        other => panic!("expected a codec error, got {other:?}"),
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the follower did not run");
}

async fn a_claim_coord_did_not_write_is_corrupt(client: Client) {
    let server = RedisServer::start();
    let p = provider(&server, client).await;
    let k = key("garbage");
    server.command(&[
        "SET",
        &redis_key(&k, "flight"),
        "not a token",
        "PX",
        "30000",
    ]);
    let err = p
        .flight_claim(&k, OwnerToken::new(), LONG)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::Corrupt, "{err}");
    let err = p
        .flight_wait(&k, OwnerToken::new(), LONG)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), BackendErrorKind::Corrupt, "{err}");
}

/// redis-rs over TCP (a socket coord dials and watches): the finish's notice is told once the
/// request is written, before any reply. With the server frozen nothing can answer, yet the
/// notice is told; the finish lands once the server thaws. (Other clients tell it when
/// answered, which the conformance kit holds to "no later than the answer".)
#[cfg(feature = "redis-client")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_is_told_sent_before_its_reply() {
    use coord_core::provider::SentNotice;

    let server = RedisServer::start();
    let p = Arc::new(
        coord_redis::RedisProvider::builder(server.url())
            .client(Client::RedisRs)
            .command_timeout(Duration::from_secs(30))
            .connect()
            .await
            .expect("connect to the test server"),
    );
    let k = key("sent-before-reply");
    let a = OwnerToken::new();
    assert_eq!(
        p.flight_claim(&k, a, LONG).await.unwrap(),
        FlightClaim::Claimed
    );
    server.pause();
    let (sent, told) = SentNotice::new();
    let finish = {
        let (p, k) = (p.clone(), k.clone());
        tokio::spawn(async move {
            p.flight_finish_noting_sent(&k, a, b"outcome", Duration::from_secs(5), sent)
                .await
        })
    };
    let waited = tokio::time::timeout(Duration::from_secs(10), told).await;
    let unanswered = !finish.is_finished();
    server.resume();
    waited.expect("told once written, though the frozen server could not answer");
    assert!(unanswered, "a frozen server answered the finish");
    assert!(finish.await.unwrap().unwrap(), "the finish landed on thaw");
    let kept = format!("{}:{a}", redis_key(&k, "flight"));
    assert_eq!(
        server.command(&["GET", &kept]),
        Resp::Bulk(b"outcome".to_vec())
    );
}
