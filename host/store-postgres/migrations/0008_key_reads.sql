-- The read of a group's idempotency keys ahead of its commit, as one index probe a key at any
-- size of the key table. Planned for its arguments (the connections' `force_custom_plan`), the
-- read chose a sequential scan of the whole table while it held up to about 20,000 keys: the
-- planner prices an index probe as a read from disk, and the table is in memory. At 15,000
-- keys a read of 172 of them took 1.2 ms that way against 0.36 ms through the index, and the
-- scan grows with the table until the planner changes its mind. As migrations 0006 and 0007
-- do for the commit functions: one generic plan, no sequential scan.
CREATE FUNCTION sluice_read_keys(wanted text[])
RETURNS TABLE (key text, task_id bytea, fingerprint bytea) LANGUAGE sql STABLE AS $$
    SELECT k.key, k.task_id, k.fingerprint FROM sluice_keys AS k WHERE k.key = ANY(wanted)
$$;
ALTER FUNCTION sluice_read_keys SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION sluice_read_keys SET enable_seqscan = off;
