-- An event block (one a group commit, about 20 KB of JSON under load) is past the size at which
-- PostgreSQL compresses a value, and its default compressor (pglz) took 6 % of the database's
-- time in `sluice bench e2e`; lz4 is several times faster at a similar ratio on JSON. Blocks
-- written before stay as they are (each value records its own method). A server built without
-- lz4, or older than PostgreSQL 14, keeps pglz.
DO $$
BEGIN
    EXECUTE 'ALTER TABLE sluice_event_blocks ALTER COLUMN events SET COMPRESSION lz4';
EXCEPTION WHEN feature_not_supported OR syntax_error THEN
    RAISE NOTICE 'event blocks stay compressed with pglz: %', SQLERRM;
END
$$;
