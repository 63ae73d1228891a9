-- Task records in format 2 (`sluice_store::record`: a format byte, then postcard) instead of
-- the JSON of format 1. Nothing is rewritten here: this release reads both, and a row takes
-- format 2 at its next write. The migration is the marker: a release of format 1 started on
-- this database stops at its migrations (this one is unknown to it) instead of reading a
-- format-2 row as corrupt.
COMMENT ON COLUMN sluice_tasks.record IS
    'the task: first byte 2 = format 2 (postcard); 123 (''{'') = format 1 (JSON, read only)';
