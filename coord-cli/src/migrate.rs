//! `coord migrate`: create coord's tables in PostgreSQL, or bring them up to this version.

use serde_json::json;

use crate::args::Connection;
use crate::{Exit, Failure, postgres_builder, postgres_url};

pub async fn run(connection: &Connection, json: bool) -> Result<Exit, Failure> {
    let url = postgres_url(connection).ok_or_else(|| {
        Failure::usage(
            "no PostgreSQL URL: set COORD_POSTGRES_URL or pass --postgres-url \
             postgres://user@host:port/database",
        )
    })?;
    let schema = connection
        .postgres_schema
        .as_deref()
        .map(str::trim)
        .unwrap_or(coord_postgres::DEFAULT_SCHEMA)
        .to_owned();
    let report = postgres_builder(connection, url).migrate().await?;
    if json {
        let doc = json!({
            "schema": schema,
            "from": report.from,
            "to": report.to,
            "applied": report.applied_any(),
        });
        println!("{doc:#}");
    } else if report.applied_any() {
        println!(
            "coord's tables in schema `{schema}`: migrated from version {} to {}",
            report.from, report.to
        );
    } else {
        println!(
            "coord's tables in schema `{schema}` are at version {}: nothing to do",
            report.to
        );
    }
    Ok(Exit::Done)
}
