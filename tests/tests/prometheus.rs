//! coord's metrics scraped the way Prometheus scrapes them: the exporter serves `/metrics` on a
//! loopback port, an HTTP GET reads it, and every documented series is there with sane values.
//! The Grafana dashboard shipped in `dashboards/coord.json` only queries series that exist.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use coord_core::Coordinator;
use coord_examples::{install_prometheus, small_load};

fn free_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// One `GET /metrics` over HTTP/1.1, returning the body.
fn scrape(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").expect("an HTTP response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_owned()
}

/// The value of the one sample whose name and labels are exactly `series`.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no sample `{series}` in:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_exporter_serves_every_documented_series() {
    let addr = free_port();
    install_prometheus(Some(addr)).expect("install the exporter");
    let c = Coordinator::builder()
        .namespace("prom")
        .memory()
        .build()
        .unwrap();
    small_load(&c, 10).await;

    let mut text = String::new();
    for _ in 0..50 {
        match std::panic::catch_unwind(|| scrape(addr)) {
            Ok(body) => {
                text = body;
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert!(!text.is_empty(), "the exporter never answered on {addr}");

    let acquired = sample(
        &text,
        r#"coord_calls_total{layer="lock",op="demo.rebuild",outcome="acquired"}"#,
    );
    assert!(acquired >= 10.0, "{acquired}");
    let executed = sample(
        &text,
        r#"coord_calls_total{layer="idempotency",op="demo.charge",outcome="executed"}"#,
    );
    let replayed = sample(
        &text,
        r#"coord_calls_total{layer="idempotency",op="demo.charge",outcome="replayed"}"#,
    );
    assert_eq!(executed, 40.0, "4 new requests per round");
    assert_eq!(replayed, 40.0, "and each asked twice");
    assert!(
        text.contains("# TYPE coord_lock_wait_seconds histogram"),
        "{text}"
    );
    let holds = sample(&text, r#"coord_lock_hold_seconds_count{op="demo.rebuild"}"#);
    let held = sample(&text, r#"coord_lock_hold_seconds_sum{op="demo.rebuild"}"#);
    let contended = sample(
        &text,
        r#"coord_calls_total{layer="lock",op="demo.rebuild",outcome="contended"}"#,
    );
    assert_eq!(holds, acquired + contended, "one hold per lock taken");
    let mean = held / holds;
    assert!(
        (0.001..1.0).contains(&mean),
        "a hold of 2-6 ms on average, got {mean} s"
    );
    assert!(sample(&text, r#"coord_record_size_bytes_count{op="demo.charge"}"#) >= 40.0);
    assert!(
        sample(
            &text,
            r#"coord_body_duration_seconds_count{op="demo.quote"}"#
        ) >= 10.0
    );
    assert_eq!(sample(&text, "coord_locks_held"), 0.0, "all released");

    // The dashboard queries nothing that is not exported.
    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../../dashboards/coord.json")).unwrap();
    let mut queried = BTreeSet::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"].as_str().unwrap();
            for (i, _) in expr.match_indices("coord_") {
                let name: String = expr[i..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                queried.insert(name);
            }
        }
    }
    assert!(queried.len() >= 6, "{queried:?}");
    for name in &queried {
        // Backend errors only exist once one happened; the rest must be served now.
        if name == "coord_backend_errors_total" {
            continue;
        }
        assert!(
            text.lines().any(|l| l.starts_with(name.as_str())),
            "the dashboard queries `{name}`, which is not exported"
        );
    }
}
