-- Concurrency limits set through the API (`PUT /v1/concurrency-limits/{key}`), beside the
-- configuration's, which are not stored. A key ending in `*` is a prefix.
CREATE TABLE sluice_concurrency_limits (
    key text PRIMARY KEY,
    max_running integer NOT NULL CHECK (max_running >= 0)
);
