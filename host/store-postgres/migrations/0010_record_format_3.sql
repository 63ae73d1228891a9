-- Task records in format 3 (format 2 and a split search's collection and shards). Nothing is
-- rewritten: format 2 rows read as they are. The migration is the marker: a release of
-- format 2 started on this database stops at its migrations instead of reading a format-3
-- row as corrupt.
COMMENT ON COLUMN sluice_tasks.record IS
    'the task: first byte 3 = format 3, 2 = format 2 (postcard); 123 (''{'') = format 1 (JSON, read only)';
