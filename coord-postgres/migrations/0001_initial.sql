-- coord's tables, version 1. `{schema}` is replaced by the (quoted) schema name.
--
-- Every expiry is a `timestamptz` computed from the server's clock (`clock_timestamp()`) by
-- the statement that writes it; a row past its expiry counts as absent to every statement,
-- and the sweeper deletes such rows in small batches. Keys are coord's call keys
-- (`namespace:operation[:parts]`), compared byte by byte (`COLLATE "C"`), so the keys of
-- one operation are one range of the primary key.

-- Fencing tokens: one sequence for every key, so a token is greater than every token minted
-- before it, for any key.
CREATE SEQUENCE {schema}.fence_seq AS bigint;

-- One row per held (or lapsed, not yet swept) lock.
CREATE TABLE {schema}.locks (
    key        text COLLATE "C" PRIMARY KEY,
    owner      uuid        NOT NULL,
    -- The holder's fencing token; NULL for an unfenced holder.
    fence      bigint,
    expires_at timestamptz NOT NULL,
    -- A waiter asked to be woken when this holder releases (only then does release NOTIFY).
    waited     boolean     NOT NULL DEFAULT false
) WITH (fillfactor = 80);

-- Idempotency records: an in-flight marker, then the completed outcome.
CREATE TABLE {schema}.records (
    key           text COLLATE "C" PRIMARY KEY,
    state         text        NOT NULL CHECK (state IN ('in_flight', 'completed')),
    -- The marker's owner; on a completed record, the owner whose completion stored it.
    owner         uuid        NOT NULL,
    fingerprint   bytea       CHECK (fingerprint IS NULL OR length(fingerprint) = 16),
    payload       bytea,
    -- When the row was written in its current form (claim, or completion).
    written_at    timestamptz NOT NULL,
    -- In flight only: when the marker's lease ends. Past it and before `expires_at`, the
    -- marker is abandoned (kept because its claim asked for it).
    lease_ends_at timestamptz,
    expires_at    timestamptz NOT NULL,
    waited        boolean     NOT NULL DEFAULT false,
    -- True when the completion was written inside the application's own transaction (a
    -- completion mode a later version adds); false for every row this version writes.
    transactional boolean     NOT NULL DEFAULT false,
    CHECK ((state = 'in_flight') = (lease_ends_at IS NOT NULL)),
    CHECK ((state = 'completed') = (payload IS NOT NULL)),
    CHECK (lease_ends_at IS NULL OR expires_at >= lease_ends_at)
) WITH (fillfactor = 80);
CREATE INDEX records_expires_at ON {schema}.records (expires_at);

-- The shared tier of `#[cached]`.
CREATE TABLE {schema}.cache (
    key        text COLLATE "C" PRIMARY KEY,
    value      bytea       NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE INDEX cache_expires_at ON {schema}.cache (expires_at);

-- Cluster single-flight: the leader's claim, and its outcome handed over to followers.
CREATE TABLE {schema}.flights (
    key        text COLLATE "C" PRIMARY KEY,
    owner      uuid        NOT NULL,
    expires_at timestamptz NOT NULL
);
CREATE TABLE {schema}.flight_outcomes (
    key        text COLLATE "C" NOT NULL,
    leader     uuid        NOT NULL,
    outcome    bytea       NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (key, leader)
);
CREATE INDEX flight_outcomes_expires_at ON {schema}.flight_outcomes (expires_at);
