-- coord's tables, version 2: semaphores. `{schema}` is replaced by the (quoted) schema name.
--
-- A semaphore is one row in `semaphores` (locked by every acquire and release of its key, so
-- counting the live permits and taking one is a single serialized step) and one row per
-- permit in `semaphore_permits`. The three operations are functions, so each is one
-- statement and one round trip while its steps still read each other's writes: in a
-- plpgsql function every statement takes a fresh snapshot (under READ COMMITTED), so the
-- count that follows the row lock sees every permit committed before the lock was granted.
-- Every time is `clock_timestamp()`, read once the key's row is locked.

CREATE TABLE {schema}.semaphores (
    key        text COLLATE "C" PRIMARY KEY,
    -- A waiter found the semaphore full and asked to be woken: the next release notifies.
    waited     boolean     NOT NULL DEFAULT false,
    -- At least the latest end of any permit's lease: past it the row is housekeeping only,
    -- and the sweeper deletes it.
    expires_at timestamptz NOT NULL
) WITH (fillfactor = 80);
CREATE INDEX semaphores_expires_at ON {schema}.semaphores (expires_at);

CREATE TABLE {schema}.semaphore_permits (
    key        text COLLATE "C" NOT NULL,
    owner      uuid        NOT NULL,
    -- This permit's fencing token, from the shared sequence, drawn under the key's row lock:
    -- tokens of one key increase in the order its permits were granted.
    fence      bigint      NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (key, owner)
) WITH (fillfactor = 80);
CREATE INDEX semaphore_permits_expires_at ON {schema}.semaphore_permits (expires_at);

-- Locks the row of semaphore `k`, making it when missing (a missing row may also be one the
-- sweeper deleted just now: then it is made again).
CREATE FUNCTION {schema}.semaphore_lock_key(k text, lease_ms bigint) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    LOOP
        PERFORM 1 FROM {schema}.semaphores WHERE key = k FOR UPDATE;
        IF FOUND THEN
            RETURN;
        END IF;
        INSERT INTO {schema}.semaphores (key, expires_at)
        VALUES (k, clock_timestamp() + lease_ms * interval '1 millisecond')
        ON CONFLICT (key) DO NOTHING;
    END LOOP;
END
$$;

-- Takes one permit of semaphore `k` for `who`, if fewer than `limit_n` live permits are held.
-- Returns one row `(token, left_ms)`: the permit's token (a resent acquire by the holder of a
-- live permit renews it and answers its token), or NULL and the time left on the
-- soonest-ending permit when full (then, with `watch`, the next release notifies). Expired
-- permits of the key are deleted first; they never count.
CREATE FUNCTION {schema}.semaphore_acquire(
    k text, who uuid, limit_n bigint, lease_ms bigint, watch boolean
) RETURNS TABLE (token bigint, left_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    t     timestamptz;
    ends  timestamptz;
    held  bigint;
    mine  bigint;
BEGIN
    PERFORM {schema}.semaphore_lock_key(k, lease_ms);
    t := clock_timestamp();
    ends := t + lease_ms * interval '1 millisecond';
    UPDATE {schema}.semaphore_permits p SET expires_at = ends
    WHERE p.key = k AND p.owner = who AND p.expires_at > t
    RETURNING p.fence INTO mine;
    IF mine IS NULL THEN
        DELETE FROM {schema}.semaphore_permits p WHERE p.key = k AND p.expires_at <= t;
        SELECT count(*) INTO held FROM {schema}.semaphore_permits p WHERE p.key = k;
        IF held >= limit_n THEN
            IF watch THEN
                UPDATE {schema}.semaphores s SET waited = true WHERE s.key = k AND NOT s.waited;
            END IF;
            RETURN QUERY
                SELECT NULL::bigint,
                       (extract(epoch FROM (min(p.expires_at) - t)) * 1000)::bigint
                FROM {schema}.semaphore_permits p WHERE p.key = k;
            RETURN;
        END IF;
        mine := nextval('{schema}.fence_seq');
        INSERT INTO {schema}.semaphore_permits (key, owner, fence, expires_at)
        VALUES (k, who, mine, ends);
    END IF;
    UPDATE {schema}.semaphores s SET expires_at = ends WHERE s.key = k AND s.expires_at < ends;
    RETURN QUERY SELECT mine, NULL::bigint;
END
$$;

-- Frees `who`'s permit of semaphore `k`. Returns true when it was live (then, if a waiter
-- asked, notifies `channel` with `payload` on commit); false when `who` held none, or only
-- an expired one, which is deleted without freeing anything (it no longer counted).
CREATE FUNCTION {schema}.semaphore_release(k text, who uuid, channel text, payload text)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    live boolean;
BEGIN
    -- Serialized with acquires, so a waiter's request to be woken is never missed.
    PERFORM 1 FROM {schema}.semaphores WHERE key = k FOR UPDATE;
    DELETE FROM {schema}.semaphore_permits p WHERE p.key = k AND p.owner = who
    RETURNING p.expires_at > clock_timestamp() INTO live;
    IF NOT coalesce(live, false) THEN
        RETURN false;
    END IF;
    UPDATE {schema}.semaphores s SET waited = false WHERE s.key = k AND s.waited;
    IF FOUND THEN
        PERFORM pg_notify(channel, payload);
    END IF;
    RETURN true;
END
$$;

-- Extends `who`'s live permit of semaphore `k` to `lease_ms` from now. Returns true when
-- renewed; false when `who` holds no live permit (an expired one is deleted: renewal never
-- revives a permit that stopped counting).
CREATE FUNCTION {schema}.semaphore_renew(k text, who uuid, lease_ms bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    t    timestamptz;
    ends timestamptz;
BEGIN
    -- The key's row first, as acquire and release take it (rows locked in one order by
    -- every operation: no deadlock).
    PERFORM 1 FROM {schema}.semaphores WHERE key = k FOR UPDATE;
    t := clock_timestamp();
    ends := t + lease_ms * interval '1 millisecond';
    UPDATE {schema}.semaphore_permits p SET expires_at = ends
    WHERE p.key = k AND p.owner = who AND p.expires_at > t;
    IF NOT FOUND THEN
        DELETE FROM {schema}.semaphore_permits p WHERE p.key = k AND p.owner = who;
        RETURN false;
    END IF;
    UPDATE {schema}.semaphores s SET expires_at = ends WHERE s.key = k AND s.expires_at < ends;
    RETURN true;
END
$$;
