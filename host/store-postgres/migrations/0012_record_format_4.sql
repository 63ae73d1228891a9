-- Task records in format 4 (format 3 and a task's GPU batch key). Nothing is rewritten: format
-- 2 and 3 rows read as they are. The migration is the marker: a release of format 3 started on
-- this database stops at its migrations instead of reading a format-4 row as corrupt.
COMMENT ON COLUMN sluice_tasks.record IS
    'the task: first byte 4 = format 4, 3 = format 3, 2 = format 2 (postcard); 123 (''{'') = format 1 (JSON, read only)';
