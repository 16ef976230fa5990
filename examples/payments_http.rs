//! A payments service behind coord-http's `Idempotency-Key` layer.
//!
//! Run with `cargo run -p coord-examples --features http --example payments_http`. It listens on
//! `COORD_HTTP_ADDR` (default `127.0.0.1:3000`) and prints the address. With `COORD_REDIS_URL`
//! set it coordinates through that Redis, so several instances on several ports charge once
//! per key between them; without it, in-process.
//!
//! Keys are scoped by the `X-Tenant` header: another tenant sending the same key is charged
//! on its own, never handed the first tenant's receipt. The tenant is stored only as a digest;
//! `coord --app payments_http records list payments.http --scope acme` finds its records (the
//! example names no namespace, so it uses its binary's name, which `--app` computes the same
//! way).
//!
//! ```sh
//! curl -i -X POST localhost:3000/payments -H 'Idempotency-Key: order-1' -H 'X-Tenant: acme' \
//!      -d '{"amount": 1250, "currency": "EUR"}'
//! curl -i -X POST localhost:3000/payments -H 'Idempotency-Key: order-1' -H 'X-Tenant: globex' \
//!      -d '{"amount": 1250, "currency": "EUR"}'
//! curl -s localhost:3000/payments/charges
//! ```

use coord_examples::payments::app;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::var("COORD_HTTP_ADDR").unwrap_or_else(|_| "127.0.0.1:3000".to_owned());
    // Everything from the environment: COORD_REDIS_URL, and any COORD_NAMESPACE, COORD_WAIT, ...
    let coordinator = coord_redis::coordinator_from_env().await?;
    let backend = if coordinator.is_in_process_only() {
        "in-process (set COORD_REDIS_URL to share keys)"
    } else {
        "Redis"
    };
    let (router, _) = app(coordinator);
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!(
        "payments_http listening on http://{} (coordination: {backend})",
        listener.local_addr()?
    );
    axum::serve(listener, router).await?;
    Ok(())
}
