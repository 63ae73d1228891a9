-- Sluice's PostgreSQL store, version 1. Records are kept as the bytes the embedded store keeps
-- (task and event JSON, queue entries in their packed layout); the columns beside them are
-- what a query filters or orders on. Task ids are ULIDs as 16 big-endian bytes, so byte order
-- is arrival order.

-- One row: who runs the engine, under which fencing epoch, until when (by the database's
-- clock). Every commit of the engine checks the epoch in its own transaction.
CREATE TABLE sluice_leader (
    id smallint PRIMARY KEY CHECK (id = 1),
    holder text NOT NULL,
    address text NOT NULL,
    epoch bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    synced_at timestamptz
);
INSERT INTO sluice_leader (id, holder, address, epoch, expires_at)
VALUES (1, '', '', 0, '-infinity');

CREATE TABLE sluice_tasks (
    id bytea PRIMARY KEY,
    state smallint NOT NULL,
    -- The task as JSON.
    record bytea NOT NULL,
    -- Written once, with the task.
    payload bytea NOT NULL,
    -- While queued: the queue entry the engine rebuilds its queues from at start.
    queue_entry bytea,
    idempotency_key text,
    callback_pending boolean NOT NULL,
    -- Ended, but its worker has not yet stopped the attempt: retention keeps it.
    holds_place boolean NOT NULL,
    updated_at_ms bigint NOT NULL
);
CREATE INDEX sluice_tasks_by_state ON sluice_tasks (state, id);
CREATE INDEX sluice_tasks_callback_pending ON sluice_tasks (id) WHERE callback_pending;

-- Idempotency keys: the unique constraint settles concurrent duplicates.
CREATE TABLE sluice_keys (
    key text PRIMARY KEY,
    task_id bytea NOT NULL,
    fingerprint bytea NOT NULL
);

-- The event log: append-only, `seq` gap-free (assigned by the engine, one writer at a time).
CREATE TABLE sluice_events (
    seq bigint PRIMARY KEY,
    at_ms bigint NOT NULL,
    event bytea NOT NULL
);

CREATE TABLE sluice_worker_events (
    seq bigint PRIMARY KEY,
    at_ms bigint NOT NULL,
    event bytea NOT NULL
);

-- The policy catalog. `kind` is the policy kind's code.
CREATE TABLE sluice_policy_modules (
    sha256 text PRIMARY KEY,
    module bytea NOT NULL
);
CREATE TABLE sluice_policy_versions (
    kind smallint NOT NULL,
    version integer NOT NULL,
    record bytea NOT NULL,
    PRIMARY KEY (kind, version)
);
CREATE TABLE sluice_policy_stacks (
    kind smallint PRIMARY KEY,
    stack bytea NOT NULL
);
CREATE TABLE sluice_policy_events (
    seq bigint PRIMARY KEY,
    kind smallint NOT NULL,
    event bytea NOT NULL
);
CREATE INDEX sluice_policy_events_by_kind ON sluice_policy_events (kind, seq);
CREATE TABLE sluice_policy_data (
    kind smallint NOT NULL,
    version integer NOT NULL,
    name text NOT NULL,
    bytes bytea NOT NULL,
    PRIMARY KEY (kind, version, name)
);
CREATE TABLE sluice_compiled (
    cache_key text PRIMARY KEY,
    code bytea NOT NULL
);
CREATE TABLE sluice_experiments (
    id integer PRIMARY KEY,
    record bytea NOT NULL
);

-- Tokens (hashes only) and the audit log.
CREATE TABLE sluice_tokens (
    id text PRIMARY KEY,
    record bytea NOT NULL
);
CREATE TABLE sluice_audit (
    seq bigint PRIMARY KEY,
    event bytea NOT NULL
);
