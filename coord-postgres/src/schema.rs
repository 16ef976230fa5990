//! coord's tables as versioned migrations, and the check that the schema a provider connects
//! to is the one this version of the crate speaks.
//!
//! The migrations are SQL files embedded in the crate (`migrations/NNNN_name.sql`), applied in
//! order by [`PostgresProvider::migrate`](crate::PostgresProvider::migrate) (and `coord
//! migrate`), each in the same transaction as the row it adds to `schema_version`.
//! Connecting never changes the schema: there is no DDL on any call's path.

use std::fmt;

use tokio_postgres::GenericClient;

/// One migration: its version, a name, and its SQL (with `{schema}` for the schema's quoted
/// name).
pub(crate) struct Migration {
    pub(crate) version: u32,
    pub(crate) name: &'static str,
    pub(crate) sql: &'static str,
}

/// Every migration this version knows, in order.
pub(crate) const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "initial",
        sql: include_str!("../migrations/0001_initial.sql"),
    },
    Migration {
        version: 2,
        name: "semaphores",
        sql: include_str!("../migrations/0002_semaphores.sql"),
    },
    Migration {
        version: 3,
        name: "rw_locks",
        sql: include_str!("../migrations/0003_rw_locks.sql"),
    },
];

/// The schema version this version of coord-postgres reads and writes.
pub const SCHEMA_VERSION: u32 = 3;

/// The schema used unless the builder (or the configuration) names another.
pub const DEFAULT_SCHEMA: &str = "coord";

/// Why the schema at the server is not one this provider can use. Its message says what to
/// run.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum SchemaError {
    /// coord's tables are not there (the schema, or its `schema_version` table, is missing).
    Missing {
        /// The schema looked in.
        schema: String,
    },
    /// The tables are of an older version: the migrations up to [`SCHEMA_VERSION`] have not
    /// been applied.
    Outdated {
        /// The schema looked in.
        schema: String,
        /// The version found.
        found: u32,
        /// The version this crate needs.
        expected: u32,
    },
    /// The tables are of a newer version than this crate knows (a newer coord migrated them):
    /// this version might misread them, so it refuses to use them.
    Newer {
        /// The schema looked in.
        schema: String,
        /// The version found.
        found: u32,
        /// The newest version this crate knows.
        known: u32,
    },
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SchemaError::Missing { schema } => write!(
                f,
                "coord's tables are not in schema `{schema}`: create them with `coord migrate \
                 --postgres-url <url> --postgres-schema {schema}` or \
                 `PostgresProvider::migrate()` (as a role that may create tables there)"
            ),
            SchemaError::Outdated {
                schema,
                found,
                expected,
            } => write!(
                f,
                "coord's tables in schema `{schema}` are at version {found}, this version of \
                 coord-postgres needs {expected}: run `coord migrate --postgres-url <url> \
                 --postgres-schema {schema}` or `PostgresProvider::migrate()`"
            ),
            SchemaError::Newer {
                schema,
                found,
                known,
            } => write!(
                f,
                "coord's tables in schema `{schema}` are at version {found}, newer than the \
                 {known} this version of coord-postgres knows: upgrade coord-postgres (a newer \
                 coord migrated them)"
            ),
        }
    }
}

impl std::error::Error for SchemaError {}

/// What [`PostgresProvider::migrate`](crate::PostgresProvider::migrate) did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct MigrationReport {
    /// The version before (0: no tables).
    pub from: u32,
    /// The version after: [`SCHEMA_VERSION`].
    pub to: u32,
}

impl MigrationReport {
    /// Whether anything was applied.
    pub fn applied_any(&self) -> bool {
        self.from != self.to
    }
}

/// Whether `name` is a schema name coord accepts: 1 to 63 lowercase ASCII letters, digits
/// and `_`, starting with a letter or `_`. (Quoted in every statement all the same.)
pub(crate) fn valid_schema_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !name.starts_with("pg_")
}

/// `name` quoted as an identifier.
pub(crate) fn quoted(name: &str) -> String {
    format!("\"{name}\"")
}

/// The version of coord's tables in `schema`: `None` when there is no `schema_version` table,
/// 0 when it holds no version.
pub(crate) async fn read_version(
    client: &impl GenericClient,
    schema: &str,
) -> Result<Option<u32>, tokio_postgres::Error> {
    let table = format!("{}.schema_version", quoted(schema));
    let exists = client
        .query_one("SELECT to_regclass($1::text) IS NOT NULL", &[&table])
        .await?
        .get::<_, bool>(0);
    if !exists {
        return Ok(None);
    }
    let row = client
        .query_one(
            &format!("SELECT coalesce(max(version), 0) FROM {table}"),
            &[],
        )
        .await?;
    Ok(Some(u32::try_from(row.get::<_, i32>(0)).unwrap_or(0)))
}

/// Checks that `schema` holds exactly [`SCHEMA_VERSION`].
pub(crate) fn check_version(schema: &str, found: Option<u32>) -> Result<(), SchemaError> {
    match found {
        None => Err(SchemaError::Missing {
            schema: schema.to_owned(),
        }),
        Some(v) if v < SCHEMA_VERSION => Err(SchemaError::Outdated {
            schema: schema.to_owned(),
            found: v,
            expected: SCHEMA_VERSION,
        }),
        Some(v) if v > SCHEMA_VERSION => Err(SchemaError::Newer {
            schema: schema.to_owned(),
            found: v,
            known: SCHEMA_VERSION,
        }),
        Some(_) => Ok(()),
    }
}

/// Applies every migration `schema` lacks, in one transaction, holding a transaction-scoped
/// advisory lock so that two migrators run one after the other. Refuses a schema newer than
/// this crate knows.
pub(crate) async fn migrate(
    client: &mut tokio_postgres::Client,
    schema: &str,
) -> Result<Result<MigrationReport, SchemaError>, tokio_postgres::Error> {
    let q = quoted(schema);
    let tx = client.transaction().await?;
    // One key for every migrator of this schema (the text's hash, computed by the server).
    tx.execute(
        "SELECT pg_advisory_xact_lock(hashtextextended('coord-postgres migrate ' || $1::text, 0))",
        &[&schema],
    )
    .await?;
    tx.batch_execute(&format!(
        "CREATE SCHEMA IF NOT EXISTS {q};
         CREATE TABLE IF NOT EXISTS {q}.schema_version (
             version    integer PRIMARY KEY,
             name       text        NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
         );"
    ))
    .await?;
    let from = read_version(&tx, schema).await?.unwrap_or(0);
    if from > SCHEMA_VERSION {
        tx.rollback().await?;
        return Ok(Err(SchemaError::Newer {
            schema: schema.to_owned(),
            found: from,
            known: SCHEMA_VERSION,
        }));
    }
    for migration in MIGRATIONS.iter().filter(|m| m.version > from) {
        tx.batch_execute(&migration.sql.replace("{schema}", &q))
            .await?;
        tx.execute(
            &format!("INSERT INTO {q}.schema_version (version, name) VALUES ($1, $2)"),
            &[&(migration.version as i32), &migration.name],
        )
        .await?;
    }
    tx.commit().await?;
    Ok(Ok(MigrationReport {
        from,
        to: SCHEMA_VERSION,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_numbered_in_order_up_to_the_version() {
        for (i, m) in MIGRATIONS.iter().enumerate() {
            assert_eq!(m.version as usize, i + 1, "{}", m.name);
            assert!(m.sql.contains("{schema}"));
        }
        assert_eq!(MIGRATIONS.last().map(|m| m.version), Some(SCHEMA_VERSION));
    }

    #[test]
    fn schema_names() {
        for ok in ["coord", "coord_2", "_x", "a"] {
            assert!(valid_schema_name(ok), "{ok}");
        }
        for bad in [
            "",
            "Coord",
            "1x",
            "a-b",
            "a b",
            "pg_x",
            "a\"b",
            &"x".repeat(64),
        ] {
            assert!(!valid_schema_name(bad), "{bad}");
        }
    }

    #[test]
    fn version_checks_name_the_fix() {
        assert!(check_version("c", Some(SCHEMA_VERSION)).is_ok());
        let missing = check_version("c", None).unwrap_err();
        assert!(missing.to_string().contains("coord migrate"), "{missing}");
        let newer = check_version("c", Some(SCHEMA_VERSION + 1)).unwrap_err();
        assert!(matches!(newer, SchemaError::Newer { .. }));
        assert!(newer.to_string().contains("upgrade coord-postgres"));
    }
}
