-- coord's tables, version 3: read-write locks, and multi-key locks taken in one statement.
-- `{schema}` is replaced by the (quoted) schema name.
--
-- A read-write lock is one row in `rw_locks` (locked by every acquire, release and renewal of
-- its key, so checking who holds it and granting a hold is a single serialized step), holding
-- the waiting writer's claim, and one row per hold in `rw_holds`. As for semaphores, the three
-- operations are plpgsql functions: one statement and one round trip each, whose steps read
-- each other's writes (every statement of a function takes a fresh snapshot under READ
-- COMMITTED, so what follows the row lock sees every hold committed before it was granted).
-- Every time is `clock_timestamp()`, read once the key's row is locked.
--
-- A multi-key lock needs no table of its own: it writes the `locks` rows single locks use,
-- through the function `lock_acquire_all` at the end of this file.

CREATE TABLE {schema}.rw_locks (
    key           text COLLATE "C" PRIMARY KEY,
    -- A waiting writer's claim: while it is live no new reader is granted. One per key.
    claimant      uuid,
    claim_ends_at timestamptz,
    -- A waiter was refused and asked to be woken: the next release (or withdrawn claim)
    -- notifies.
    waited        boolean     NOT NULL DEFAULT false,
    -- At least the latest end of any hold's lease and of the claim: past it the row is
    -- housekeeping only, and the sweeper deletes it.
    expires_at    timestamptz NOT NULL,
    CHECK ((claimant IS NULL) = (claim_ends_at IS NULL))
) WITH (fillfactor = 80);
CREATE INDEX rw_locks_expires_at ON {schema}.rw_locks (expires_at);

CREATE TABLE {schema}.rw_holds (
    key        text COLLATE "C" NOT NULL,
    -- Owners are per hold: one owner never holds both modes of a key.
    owner      uuid        NOT NULL,
    mode       text        NOT NULL CHECK (mode IN ('read', 'write')),
    -- This hold's fencing token, from the sequence every lock and permit draws from, drawn
    -- under the key's row lock: tokens of one key increase in the order its holds were
    -- granted, readers and writers alike.
    fence      bigint      NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (key, owner)
) WITH (fillfactor = 80);
CREATE INDEX rw_holds_expires_at ON {schema}.rw_holds (expires_at);
-- At most one write hold per key, whatever a bug elsewhere might try (ended holds are deleted
-- before any grant, under the key's row lock).
CREATE UNIQUE INDEX rw_holds_one_writer ON {schema}.rw_holds (key) WHERE mode = 'write';

-- Locks the row of read-write lock `k`, making it when missing (a missing row may also be one
-- the sweeper deleted just now: then it is made again).
CREATE FUNCTION {schema}.rw_lock_key(k text, lease_ms bigint) RETURNS void
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    LOOP
        PERFORM 1 FROM {schema}.rw_locks WHERE key = k FOR UPDATE;
        IF FOUND THEN
            RETURN;
        END IF;
        INSERT INTO {schema}.rw_locks (key, expires_at)
        VALUES (k, clock_timestamp() + lease_ms * interval '1 millisecond')
        ON CONFLICT (key) DO NOTHING;
    END LOOP;
END
$$;

-- Takes a hold of read-write lock `k` for `who`: a write hold (`writing`) while no live hold
-- exists and no other writer's claim is live, a read hold while no live write hold and no
-- live claim exist. Returns one row `(token, left_ms)`: the hold's token (a resent acquire by
-- the owner of a live hold of the same mode renews it and answers its token), or NULL and
-- how long until the first hold or claim in the way ends (for the claim's own writer, at
-- most half its claim, so that it re-asserts the claim in time). With `watch` (the caller
-- waits), a refused writer leaves or re-asserts its claim, ending `claim_ms` from now, when no
-- other writer's claim is live, and every refused caller asks the next release to notify.
-- Ended holds and an ended claim of the key are deleted first: they never count.
CREATE FUNCTION {schema}.rw_acquire(
    k text, who uuid, writing boolean, lease_ms bigint, claim_ms bigint, watch boolean
) RETURNS TABLE (token bigint, left_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    t       timestamptz;
    ends    timestamptz;
    m       text := CASE WHEN writing THEN 'write' ELSE 'read' END;
    mine    bigint;
    c       uuid;
    c_ends  timestamptz;
    blocked boolean;
    soonest timestamptz;
BEGIN
    PERFORM {schema}.rw_lock_key(k, lease_ms);
    t := clock_timestamp();
    ends := t + lease_ms * interval '1 millisecond';
    DELETE FROM {schema}.rw_holds h WHERE h.key = k AND h.expires_at <= t;
    UPDATE {schema}.rw_locks r SET claimant = NULL, claim_ends_at = NULL
    WHERE r.key = k AND r.claim_ends_at <= t;
    UPDATE {schema}.rw_holds h SET expires_at = ends
    WHERE h.key = k AND h.owner = who AND h.mode = m
    RETURNING h.fence INTO mine;
    IF mine IS NULL THEN
        SELECT r.claimant, r.claim_ends_at INTO c, c_ends FROM {schema}.rw_locks r WHERE r.key = k;
        IF writing THEN
            blocked := EXISTS (SELECT 1 FROM {schema}.rw_holds h WHERE h.key = k)
                       OR (c IS NOT NULL AND c <> who);
        ELSE
            blocked := EXISTS (SELECT 1 FROM {schema}.rw_holds h
                               WHERE h.key = k AND h.mode = 'write')
                       OR c IS NOT NULL;
        END IF;
        IF blocked THEN
            IF watch THEN
                IF writing AND (c IS NULL OR c = who) THEN
                    c := who;
                    c_ends := t + claim_ms * interval '1 millisecond';
                    UPDATE {schema}.rw_locks r
                    SET claimant = who, claim_ends_at = c_ends, waited = true,
                        expires_at = greatest(r.expires_at, c_ends)
                    WHERE r.key = k;
                ELSE
                    UPDATE {schema}.rw_locks r SET waited = true WHERE r.key = k AND NOT r.waited;
                END IF;
            END IF;
            SELECT min(h.expires_at) INTO soonest FROM {schema}.rw_holds h
            WHERE h.key = k AND (writing OR h.mode = 'write');
            IF c = who THEN
                soonest := least(soonest, t + (claim_ms / 2) * interval '1 millisecond');
            ELSIF c IS NOT NULL THEN
                soonest := least(soonest, c_ends);
            END IF;
            RETURN QUERY
                SELECT NULL::bigint, (extract(epoch FROM (soonest - t)) * 1000)::bigint;
            RETURN;
        END IF;
        mine := nextval('{schema}.fence_seq');
        INSERT INTO {schema}.rw_holds (key, owner, mode, fence, expires_at)
        VALUES (k, who, m, mine, ends);
        IF writing THEN
            UPDATE {schema}.rw_locks r SET claimant = NULL, claim_ends_at = NULL
            WHERE r.key = k AND r.claimant = who;
        END IF;
    END IF;
    UPDATE {schema}.rw_locks r SET expires_at = ends WHERE r.key = k AND r.expires_at < ends;
    RETURN QUERY SELECT mine, NULL::bigint;
END
$$;

-- Frees `who`'s hold of read-write lock `k` in the mode `writing` names (a read release never
-- touches a write hold, nor the other way round); a write release also withdraws `who`'s
-- claim. Returns true when the hold was live; false when `who` held none of that mode, or
-- only an ended one, which is deleted without freeing anything (it no longer counted). When a
-- live hold was freed or a claim withdrawn and a waiter asked, notifies `channel` with
-- `payload` on commit.
CREATE FUNCTION {schema}.rw_release(
    k text, who uuid, writing boolean, channel text, payload text
) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    live      boolean;
    withdrawn boolean := false;
BEGIN
    -- Serialized with acquires, so a waiter's request to be woken is never missed.
    PERFORM 1 FROM {schema}.rw_locks WHERE key = k FOR UPDATE;
    DELETE FROM {schema}.rw_holds h
    WHERE h.key = k AND h.owner = who AND h.mode = CASE WHEN writing THEN 'write' ELSE 'read' END
    RETURNING h.expires_at > clock_timestamp() INTO live;
    IF writing THEN
        UPDATE {schema}.rw_locks r SET claimant = NULL, claim_ends_at = NULL
        WHERE r.key = k AND r.claimant = who;
        withdrawn := FOUND;
    END IF;
    IF coalesce(live, false) OR withdrawn THEN
        UPDATE {schema}.rw_locks r SET waited = false WHERE r.key = k AND r.waited;
        IF FOUND THEN
            PERFORM pg_notify(channel, payload);
        END IF;
    END IF;
    RETURN coalesce(live, false);
END
$$;

-- Extends `who`'s live hold of read-write lock `k` in the mode `writing` names to `lease_ms`
-- from now. Returns 1 when renewed; 2 when a write renewal finds another writer holding the
-- key (the owner's lease ended and the key was taken); 0 when `who` holds no live hold of that
-- mode (an ended one is deleted: renewal never revives a hold that stopped counting).
CREATE FUNCTION {schema}.rw_renew(k text, who uuid, writing boolean, lease_ms bigint)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    t    timestamptz;
    ends timestamptz;
    m    text := CASE WHEN writing THEN 'write' ELSE 'read' END;
BEGIN
    -- The key's row first, as acquire and release take it (rows locked in one order by
    -- every operation: no deadlock).
    PERFORM 1 FROM {schema}.rw_locks WHERE key = k FOR UPDATE;
    t := clock_timestamp();
    ends := t + lease_ms * interval '1 millisecond';
    UPDATE {schema}.rw_holds h SET expires_at = ends
    WHERE h.key = k AND h.owner = who AND h.mode = m AND h.expires_at > t;
    IF FOUND THEN
        UPDATE {schema}.rw_locks r SET expires_at = ends
        WHERE r.key = k AND r.expires_at < ends;
        RETURN 1;
    END IF;
    DELETE FROM {schema}.rw_holds h WHERE h.key = k AND h.owner = who AND h.mode = m;
    IF writing AND EXISTS (SELECT 1 FROM {schema}.rw_holds h
                           WHERE h.key = k AND h.mode = 'write' AND h.expires_at > t) THEN
        RETURN 2;
    END IF;
    RETURN 0;
END
$$;

-- Takes every lock of `ks` (distinct keys, in the caller's canonical order) for `who`, all or
-- none, exactly as a fenced single acquire takes each: a key is taken when its row is absent,
-- lapsed or already `who`'s (a resend: the lease restarts), and each key's token is drawn from
-- the shared sequence once every key is taken, under the rows' locks, so it is greater than
-- every token drawn before for that key. Returns one row `(tokens, blocked, left_ms)`: the
-- tokens in the order of `ks`; or NULL, the position (from 1) of the first key held by
-- another owner, and that holder's remaining lease (0 when it was released meanwhile: look
-- again at once). With `watch`, the blocking holder's row is marked waited for, so its
-- release notifies as for a single waiter.
--
-- The keys are taken inside a block whose exception handler is a subtransaction: a key found
-- held raises, which rolls back every key taken before it, so no other session ever sees the
-- set half taken (the rows are uncommitted until the whole set is) and a refused call leaves
-- nothing behind. Taking the keys in one order everywhere means two such calls never wait for
-- each other in a cycle; a single acquire touches one row only.
CREATE FUNCTION {schema}.lock_acquire_all(ks text[], who uuid, lease_ms bigint, watch boolean)
RETURNS TABLE (tokens bigint[], blocked integer, left_ms bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    t     timestamptz := clock_timestamp();
    ends  timestamptz := t + lease_ms * interval '1 millisecond';
    n     integer := coalesce(array_length(ks, 1), 0);
    pos   integer;
    tok   bigint;
    drawn bigint[] := '{}';
    rest  bigint;
BEGIN
    BEGIN
        FOR i IN 1 .. n LOOP
            pos := i;
            INSERT INTO {schema}.locks AS l (key, owner, fence, expires_at, waited)
            VALUES (ks[i], who, NULL, ends, false)
            ON CONFLICT (key) DO UPDATE SET
                owner = excluded.owner,
                fence = NULL,
                expires_at = excluded.expires_at,
                -- A resend keeps a waiter's mark; a lapsed holder's waiters mark again.
                waited = l.waited AND l.owner = excluded.owner
            WHERE l.expires_at <= t OR l.owner = excluded.owner;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'coord: key % of the set is held', i USING ERRCODE = 'CO001';
            END IF;
        END LOOP;
        pos := NULL;
        FOR i IN 1 .. n LOOP
            UPDATE {schema}.locks l SET fence = nextval('{schema}.fence_seq')
            WHERE l.key = ks[i] AND l.owner = who
            RETURNING l.fence INTO tok;
            drawn := drawn || tok;
        END LOOP;
    EXCEPTION WHEN SQLSTATE 'CO001' THEN
        -- `pos` is the key found held; everything taken before it is rolled back.
        NULL;
    END;
    IF pos IS NULL THEN
        RETURN QUERY SELECT drawn, NULL::integer, NULL::bigint;
        RETURN;
    END IF;
    IF watch THEN
        UPDATE {schema}.locks l SET waited = true
        WHERE l.key = ks[pos] AND l.owner <> who AND NOT l.waited
          AND l.expires_at > clock_timestamp();
    END IF;
    SELECT greatest(0, (extract(epoch FROM (l.expires_at - clock_timestamp())) * 1000)::bigint)
    INTO rest FROM {schema}.locks l
    WHERE l.key = ks[pos] AND l.owner <> who AND l.expires_at > clock_timestamp();
    RETURN QUERY SELECT NULL::bigint[], pos, coalesce(rest, 0);
END
$$;
