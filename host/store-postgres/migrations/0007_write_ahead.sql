-- A write-ahead log for the task rows. A group commit used to write every task row it changed
-- (an insert and two updates of a whole record in a task's life), and the leader's commits
-- run one after another: those row writes were most of the database's time on the leader's
-- path. Now a commit appends one record holding the group's rows (`sluice_wal`), beside its
-- idempotency keys (whose unique constraint must still decide at commit), its event block and
-- its worker log entries; a materializer writes the rows into `sluice_tasks` later, in
-- rounds, each task's newest row once per round (a task submitted and ended within a round is
-- inserted once, as ended), and removes the records it has written in the same transaction.
-- A new leader (or a restart) writes what the log still holds before it reads the tables.
CREATE TABLE sluice_wal (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    -- The rows of one commit, in the store's own layout (`store/postgres/wal.rs`).
    rows bytea NOT NULL
);
DO $$
BEGIN
    EXECUTE 'ALTER TABLE sluice_wal ALTER COLUMN rows SET COMPRESSION lz4';
EXCEPTION WHEN feature_not_supported OR syntax_error THEN
    RAISE NOTICE 'write-ahead records stay compressed with pglz: %', SQLERRM;
END
$$;

-- The fence of the functions below: fails with SQLSTATE SL001 unless the lease is still at the
-- caller's epoch, and holds the lease row locked until the caller's transaction ends, so a
-- takeover waits for that transaction to finish.
CREATE FUNCTION sluice_fence(fencing_epoch bigint) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    current_epoch bigint;
BEGIN
    SELECT epoch INTO current_epoch FROM sluice_leader WHERE id = 1 FOR SHARE;
    IF current_epoch IS DISTINCT FROM fencing_epoch THEN
        RAISE EXCEPTION 'deposed: the leader lease is at epoch %, this replica led under %',
            current_epoch, fencing_epoch USING ERRCODE = 'SL001';
    END IF;
END
$$;

-- One group commit as one call: the fence, the log record, the keys, the event block and the
-- worker log, in one round trip and one asynchronously committed transaction (the flusher's
-- next synchronous write makes it durable). Returns the record's id (0 with no rows).
-- SQLSTATE SL001: a deposed leader's commit.
CREATE FUNCTION sluice_log_commit(
    fencing_epoch bigint,
    wal_rows bytea,
    key_names text[], key_tasks bytea[], key_fingerprints bytea[],
    events_first_seq int8, events_last_seq int8, events_last_at_ms int8,
    event_offsets int4[], event_bytes bytea,
    worker_seqs int8[], worker_times int8[], worker_bytes bytea[]
) RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    wal_id bigint := 0;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM sluice_fence(fencing_epoch);
    IF wal_rows IS NOT NULL THEN
        INSERT INTO sluice_wal (rows) VALUES (wal_rows) RETURNING id INTO wal_id;
    END IF;
    IF cardinality(key_names) > 0 THEN
        INSERT INTO sluice_keys (key, task_id, fingerprint)
        SELECT * FROM UNNEST(key_names, key_tasks, key_fingerprints);
    END IF;
    IF events_first_seq IS NOT NULL THEN
        INSERT INTO sluice_event_blocks (first_seq, last_seq, last_at_ms, offsets, events)
        VALUES (events_first_seq, events_last_seq, events_last_at_ms, event_offsets, event_bytes);
    END IF;
    IF cardinality(worker_seqs) > 0 THEN
        INSERT INTO sluice_worker_events (seq, at_ms, event)
        SELECT * FROM UNNEST(worker_seqs, worker_times, worker_bytes);
    END IF;
    RETURN wal_id;
END
$$;

-- One materializer round (or a replay of the log) as one call: the fence, the rows of the
-- records up to `through_wal_id` (new tasks inserted with their payloads, the others updated),
-- and the removal of those records, in one asynchronously committed transaction; lost in a
-- crash, it is lost with its removals, and the next replay writes the same rows again.
-- An update that finds no row is of a task retention removed meanwhile: it stays removed.
CREATE FUNCTION sluice_apply(
    fencing_epoch bigint,
    through_wal_id bigint,
    new_ids bytea[], new_states int2[], new_records bytea[], new_payloads bytea[],
    new_queue_entries bytea[], new_keys text[], new_callbacks_pending bool[],
    new_holding bool[], new_updated_at_ms int8[],
    changed_ids bytea[], changed_states int2[], changed_records bytea[],
    changed_queue_entries bytea[], changed_callbacks_pending bool[], changed_holding bool[],
    changed_updated_at_ms int8[]
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    PERFORM sluice_fence(fencing_epoch);
    IF cardinality(new_ids) > 0 THEN
        INSERT INTO sluice_tasks (id, state, record, payload, queue_entry, idempotency_key,
                                  callback_pending, holds_place, updated_at_ms)
        SELECT * FROM UNNEST(new_ids, new_states, new_records, new_payloads, new_queue_entries,
                             new_keys, new_callbacks_pending, new_holding, new_updated_at_ms)
        -- A round is written again when its answer was lost: what it wrote then is written
        -- over with the same rows, instead of failing on the primary key for ever.
        ON CONFLICT (id) DO UPDATE SET state = EXCLUDED.state, record = EXCLUDED.record,
            queue_entry = EXCLUDED.queue_entry, callback_pending = EXCLUDED.callback_pending,
            holds_place = EXCLUDED.holds_place, updated_at_ms = EXCLUDED.updated_at_ms;
    END IF;
    IF cardinality(changed_ids) > 0 THEN
        UPDATE sluice_tasks AS t SET state = u.state, record = u.record,
            queue_entry = u.queue_entry, callback_pending = u.callback_pending,
            holds_place = u.holds_place, updated_at_ms = u.updated_at_ms
        FROM UNNEST(changed_ids, changed_states, changed_records, changed_queue_entries,
                    changed_callbacks_pending, changed_holding, changed_updated_at_ms)
            AS u(id, state, record, queue_entry, callback_pending, holds_place, updated_at_ms)
        WHERE t.id = u.id;
    END IF;
    DELETE FROM sluice_wal WHERE id <= through_wal_id;
END
$$;
-- As migration 0006 does for sluice_commit: one generic plan, the changed rows found one by
-- one through the primary key at any table size.
ALTER FUNCTION sluice_apply SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION sluice_apply SET enable_seqscan = off;
ALTER FUNCTION sluice_apply SET enable_hashjoin = off;
ALTER FUNCTION sluice_apply SET enable_mergejoin = off;
-- `sluice_commit` (migration 0002) stays, unused by this version: a leader of the version
-- before keeps committing through it during a rolling upgrade until a replica of this one
-- takes over (its log is empty then, and the tables are as that leader left them).

-- The other way round is refused: a replica of a version before this one does not read the
-- write-ahead log, so if it took over from a leader of this version the rows still in the log
-- would be lost to it. Taking the lease (the epoch moving on) must say that the taker reads
-- the log (`sluice.write_ahead` set to on in its transaction); older replicas never do, so
-- they keep following, and an operator sees why in their logs. SQLSTATE SL003.
CREATE FUNCTION sluice_leader_takeover_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.epoch IS DISTINCT FROM OLD.epoch
       AND coalesce(current_setting('sluice.write_ahead', true), '') <> 'on' THEN
        RAISE EXCEPTION 'this replica cannot lead: the store has a write-ahead log (migration 7) that its version does not read; upgrade it'
            USING ERRCODE = 'SL003';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER sluice_leader_takeover_guard BEFORE UPDATE ON sluice_leader
    FOR EACH ROW EXECUTE FUNCTION sluice_leader_takeover_guard();
