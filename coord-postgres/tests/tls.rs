//! TLS settings: `sslmode=prefer` (the default) falls back to plain text on a server without
//! TLS, which every other test here relies on; `sslmode=require` refuses such a server; CA files
//! that are missing or hold no certificate are refused at connect, naming the file.

mod support;

use coord_core::BackendError;
use coord_core::provider::BackendErrorKind;
use coord_postgres::PostgresProvider;

async fn connect_err(builder: coord_postgres::PostgresProviderBuilder) -> BackendError {
    BackendError::from(builder.connect().await.expect_err("refused"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ca_files_that_cannot_be_used_are_refused_naming_the_file() {
    let url = support::server().url();
    let missing = std::env::temp_dir().join("coord-postgres-no-such-ca.pem");
    let err = connect_err(PostgresProvider::builder(&url).tls_ca_file(&missing)).await;
    assert_eq!(err.kind(), BackendErrorKind::Config, "{err:?}");
    assert!(
        err.message().contains("coord-postgres-no-such-ca.pem"),
        "{err}"
    );

    let empty = std::env::temp_dir().join(format!(
        "coord-postgres-empty-ca-{}.pem",
        std::process::id()
    ));
    std::fs::write(&empty, "not a certificate\n").unwrap();
    let err = connect_err(PostgresProvider::builder(&url).tls_ca_file(&empty)).await;
    let _ = std::fs::remove_file(&empty);
    assert_eq!(err.kind(), BackendErrorKind::Config, "{err:?}");
    assert!(err.message().contains("no PEM certificate"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_refuses_a_server_without_tls_and_prefer_falls_back() {
    let server = support::server();
    let required = format!("{}?sslmode=require", server.url());
    let err = connect_err(PostgresProvider::builder(&required)).await;
    assert!(err.to_string().to_lowercase().contains("tls"), "{err}");
    // libpq's verify-full is read as require (coord always verifies): refused the same way.
    let verify = format!("{}?sslmode=verify-full", server.url());
    assert!(PostgresProvider::builder(&verify).connect().await.is_err());
    let preferred = format!("{}?sslmode=prefer", server.url());
    PostgresProvider::builder(&preferred)
        .connect()
        .await
        .expect("prefer falls back to plain text");
}
