-- The event log as blocks: one row per group commit, holding its run of consecutive seqs as
-- their JSON side by side, with where each starts (and the last ends) in `offsets`. A row per
-- event cost a third of a commit's time; a block costs one row and one index entry.
CREATE TABLE sluice_event_blocks (
    first_seq bigint PRIMARY KEY,
    last_seq bigint NOT NULL UNIQUE,
    -- The newest event's time: retention removes a block once it is before the cutoff.
    last_at_ms bigint NOT NULL,
    offsets int4[] NOT NULL,
    events bytea NOT NULL
);
INSERT INTO sluice_event_blocks (first_seq, last_seq, last_at_ms, offsets, events)
SELECT seq, seq, at_ms, ARRAY[0, length(event)], event FROM sluice_events;
DROP TABLE sluice_events;

-- The row the flusher's synchronous write updates to make every earlier commit durable: apart
-- from the lease row, which each commit locks to check its epoch, so that a sync never waits
-- for a commit and a commit never waits for a sync's WAL flush.
CREATE TABLE sluice_syncs (
    id smallint PRIMARY KEY CHECK (id = 1),
    synced_at timestamptz
);
INSERT INTO sluice_syncs (id, synced_at) VALUES (1, NULL);
ALTER TABLE sluice_leader DROP COLUMN synced_at;

-- One group commit of the engine as one call: the fencing check and every write in a single
-- round trip (a transaction of separate statements took nine, and the leader's writer waits on
-- each). Asynchronous commit: the flusher's next synchronous write makes it durable.
--
-- Errors the store recognises by their SQLSTATE: SL001 a deposed leader's commit (the lease
-- moved to another epoch), SL002 an update of a task that has no row.
CREATE FUNCTION sluice_commit(
    fencing_epoch bigint,
    new_ids bytea[], new_states int2[], new_records bytea[], new_payloads bytea[],
    new_queue_entries bytea[], new_keys text[], new_callbacks_pending bool[],
    new_holding bool[], new_updated_at_ms int8[],
    changed_ids bytea[], changed_states int2[], changed_records bytea[],
    changed_queue_entries bytea[], changed_callbacks_pending bool[], changed_holding bool[],
    changed_updated_at_ms int8[],
    key_names text[], key_tasks bytea[], key_fingerprints bytea[],
    events_first_seq int8, events_last_seq int8, events_last_at_ms int8,
    event_offsets int4[], event_bytes bytea,
    worker_seqs int8[], worker_times int8[], worker_bytes bytea[]
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    current_epoch bigint;
    changed bigint;
BEGIN
    PERFORM set_config('synchronous_commit', 'off', true);
    -- Locked until the transaction ends, so a takeover waits for this commit to finish.
    SELECT epoch INTO current_epoch FROM sluice_leader WHERE id = 1 FOR SHARE;
    IF current_epoch IS DISTINCT FROM fencing_epoch THEN
        RAISE EXCEPTION 'deposed: the leader lease is at epoch %, this replica led under %',
            current_epoch, fencing_epoch USING ERRCODE = 'SL001';
    END IF;
    IF cardinality(new_ids) > 0 THEN
        INSERT INTO sluice_tasks (id, state, record, payload, queue_entry, idempotency_key,
                                  callback_pending, holds_place, updated_at_ms)
        SELECT * FROM UNNEST(new_ids, new_states, new_records, new_payloads, new_queue_entries,
                             new_keys, new_callbacks_pending, new_holding, new_updated_at_ms);
    END IF;
    IF cardinality(changed_ids) > 0 THEN
        UPDATE sluice_tasks AS t SET state = u.state, record = u.record,
            queue_entry = u.queue_entry, callback_pending = u.callback_pending,
            holds_place = u.holds_place, updated_at_ms = u.updated_at_ms
        FROM UNNEST(changed_ids, changed_states, changed_records, changed_queue_entries,
                    changed_callbacks_pending, changed_holding, changed_updated_at_ms)
            AS u(id, state, record, queue_entry, callback_pending, holds_place, updated_at_ms)
        WHERE t.id = u.id;
        GET DIAGNOSTICS changed = ROW_COUNT;
        IF changed <> cardinality(changed_ids) THEN
            RAISE EXCEPTION '% of % changed tasks have no row',
                cardinality(changed_ids) - changed, cardinality(changed_ids)
                USING ERRCODE = 'SL002';
        END IF;
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
END
$$;
