-- The connections plan every statement for its arguments (`plan_cache_mode` is
-- `force_custom_plan`, so a plan made while a table was nearly empty is never kept for later),
-- and that held inside `sluice_commit` too: its statements were planned again at every call,
-- a quarter of the function's time in `sluice bench e2e`. Its statements have one right plan
-- at any table size (the changed rows found one by one through the primary key; the inserts
-- need no plan choice), so the function keeps one generic plan per connection, with the plan
-- shapes that could go wrong on a small table (a sequential scan, a hash or merge join against
-- the whole task table) ruled out. These settings hold for the function's own statements only.
-- A later `CREATE OR REPLACE FUNCTION sluice_commit` drops them unless it repeats them.
ALTER FUNCTION sluice_commit
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION sluice_commit
    SET enable_seqscan = off;
ALTER FUNCTION sluice_commit
    SET enable_hashjoin = off;
ALTER FUNCTION sluice_commit
    SET enable_mergejoin = off;
