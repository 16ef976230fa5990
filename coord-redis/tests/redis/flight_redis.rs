//! Cluster-scope single-flight against a real redis-server, for every client: the layout in
//! Redis, followers that lose their subscriber connection, hand-overs that do not decode, and
//! values coord did not write.

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coord_core::provider::{BackendErrorKind, FlightClaim, FlightStore, FlightWait, OwnerToken};
use coord_core::{CoordError, Coordinator};
use coord_redis::{Client, RedisProvider};
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

/// A subscription that fails does not end the wait: here the server refuses it (an ACL user
/// with every key and command but no channel: `SUBSCRIBE` answers `NOPERM`), which is how a
/// subscriber connection dropped between the server taking the subscription and the client
/// reading its confirmation looks to the waiter too. The follower keeps its place and looks
/// again within the backstop (1 s), so it gets the leader's outcome, neither an error nor the
/// lease's end. Without the fall-back the wait failed with the subscription's error.
///
/// redis-rs only: fred resolves `SUBSCRIBE` once written and does not hand its error reply
/// back, so to coord a refused subscription looks confirmed there, and a follower waits for
/// the leader's message or the lease (DEPLOYMENT.md names the channels an ACL must allow).
#[cfg(feature = "redis-client")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_refused_its_subscription_still_gets_the_outcome() {
    let client = Client::RedisRs;
    let server = RedisServer::start();
    server.add_acl_user("no-channels", "pw", &["~*", "resetchannels", "+@all"]);
    let leader = provider(&server, client).await;
    let follower = RedisProvider::builder(format!(
        "redis://no-channels:pw@127.0.0.1:{}",
        server.port()
    ))
    .client(client)
    .connect()
    .await
    .expect("connect as the user without channels");
    let k = key("refused");
    let a = OwnerToken::new();
    assert_eq!(
        leader.flight_claim(&k, a, LONG).await.unwrap(),
        FlightClaim::Claimed
    );
    let waiting = {
        let k = k.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let got = follower.flight_wait(&k, a, LONG).await;
            (got, started.elapsed())
        })
    };
    // The fault bit: the server logged the refused subscription (an entry whose fields read
    // `reason channel ... username no-channels`).
    fn words(reply: &Resp, out: &mut Vec<String>) {
        match reply {
            Resp::Array(items) => items.iter().for_each(|item| words(item, out)),
            other => out.extend(other.text()),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut log = Vec::new();
        words(&server.command(&["ACL", "LOG"]), &mut log);
        let field = |name: &str| log.windows(2).any(|w| w[0] == name && w[1] == "channel");
        if field("reason") && log.iter().any(|w| w == "no-channels") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the follower's subscription was never refused: {log:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!waiting.is_finished(), "the refusal ended the wait");
    assert!(leader.flight_finish(&k, a, b"outcome", LONG).await.unwrap());
    let finished = Instant::now();
    let (got, waited) = waiting.await.unwrap();
    assert_eq!(got.unwrap(), FlightWait::Finished(b"outcome".to_vec()));
    assert!(
        finished.elapsed() < Duration::from_secs(10) && waited < Duration::from_secs(20),
        "found by a re-check within the backstop, not at the 30 s lease: {waited:?}"
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
        RedisProvider::builder(server.url())
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
