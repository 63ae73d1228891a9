-- A state change rewrites a task's row. With no index on a column it changes, PostgreSQL
-- updates the row in place on its page (a HOT update) instead of adding an entry to every
-- index; the index on (state, id) made every change touch two. In its place: `live`, true
-- until the task ends (state codes 7 and up are the ended states, as `State::code` numbers
-- them), which changes once in a task's life, and an index of the live tasks by id, which
-- lists and recovery of queued, leased and waiting tasks read. Pages keep room for updates.
DROP INDEX sluice_tasks_by_state;
ALTER TABLE sluice_tasks ADD COLUMN live boolean GENERATED ALWAYS AS (state < 7) STORED;
CREATE INDEX sluice_tasks_live ON sluice_tasks (id) WHERE live;
ALTER TABLE sluice_tasks SET (fillfactor = 70);
