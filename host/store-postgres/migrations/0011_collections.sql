-- Vector collections declared through the API (`PUT /v1/collections/{name}`): name, dimension,
-- metric and shard count, as the JSON of `sluice_model::Collection`.
CREATE TABLE sluice_collections (
    name text PRIMARY KEY,
    record jsonb NOT NULL
);
