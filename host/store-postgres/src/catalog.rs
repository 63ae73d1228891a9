//! The policy catalog (components, versions, activation stacks, the policy log, data blobs, the
//! compiled-code cache, experiments) and the access catalog (tokens, the audit log) in
//! PostgreSQL. Each write is one transaction; those that log an event take a transaction-scoped
//! advisory lock to number it, so replicas writing at once never share a `seq`. Only the leader
//! writes here in practice (followers forward every request to it), and a replica that takes
//! the lease over reads the catalog afresh, so no replica keeps a copy to be told about.

use super::{PgStore, corrupt, int8, uint8};
use crate::backend;
use sluice_model::{
    AuditEvent, Collection, ConcurrencyLimit, Experiment, PolicyEvent, PolicyKind, PolicyVersion,
    TokenRecord,
};
use sluice_store::{AccessCatalog, MAX_AUDIT_EVENTS, PolicyCatalog, StoreError};

/// Advisory lock keys (one number space per database, shared with anything else using it:
/// these spell "slcp" and "slca").
const POLICY_LOG_LOCK: i64 = 0x736c_6370;
const AUDIT_LOG_LOCK: i64 = 0x736c_6361;

fn json<T: serde::Serialize>(value: &T, what: &'static str) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|e| corrupt(what, e))
}

fn parse<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &'static str,
) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| corrupt(what, e))
}

fn kind_code(kind: PolicyKind) -> i16 {
    i16::from(kind.code())
}

/// What a logged policy write changes beside its event.
enum PolicyWrite {
    Version {
        sha256: String,
        module: Vec<u8>,
        kind: i16,
        version: i32,
        record: Vec<u8>,
    },
    Stack {
        kind: i16,
        stack: Vec<u8>,
    },
    Experiment {
        id: i32,
        record: Vec<u8>,
    },
}

async fn apply(tx: &mut sqlx::PgConnection, write: PolicyWrite) -> Result<(), sqlx::Error> {
    match write {
        PolicyWrite::Version {
            sha256,
            module,
            kind,
            version,
            record,
        } => {
            sqlx::query(
                "INSERT INTO sluice_policy_modules (sha256, module) VALUES ($1, $2) \
                 ON CONFLICT (sha256) DO NOTHING",
            )
            .bind(sha256)
            .bind(module)
            .execute(&mut *tx)
            .await?;
            sqlx::query(
                "INSERT INTO sluice_policy_versions (kind, version, record) VALUES ($1, $2, $3)",
            )
            .bind(kind)
            .bind(version)
            .bind(record)
            .execute(&mut *tx)
            .await?;
        }
        PolicyWrite::Stack { kind, stack } => {
            sqlx::query(
                "INSERT INTO sluice_policy_stacks (kind, stack) VALUES ($1, $2) \
                 ON CONFLICT (kind) DO UPDATE SET stack = excluded.stack",
            )
            .bind(kind)
            .bind(stack)
            .execute(&mut *tx)
            .await?;
        }
        PolicyWrite::Experiment { id, record } => {
            sqlx::query(
                "INSERT INTO sluice_experiments (id, record) VALUES ($1, $2) \
                 ON CONFLICT (id) DO UPDATE SET record = excluded.record",
            )
            .bind(id)
            .bind(record)
            .execute(&mut *tx)
            .await?;
        }
    }
    Ok(())
}

impl PgStore {
    /// Applies `write` and appends `event` (numbered here) in one transaction.
    fn write_policy_event(
        &self,
        write: PolicyWrite,
        mut event: PolicyEvent,
    ) -> Result<PolicyEvent, StoreError> {
        let pool = self.pool();
        let _writing = self
            .catalog_writes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        self.block(async move {
            let mut tx = pool.begin().await.map_err(backend)?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(POLICY_LOG_LOCK)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            let last: i64 =
                sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM sluice_policy_events")
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(backend)?;
            event.seq = uint8(last, "policy log")? + 1;
            apply(&mut tx, write).await.map_err(backend)?;
            sqlx::query("INSERT INTO sluice_policy_events (seq, kind, event) VALUES ($1, $2, $3)")
                .bind(int8(event.seq))
                .bind(kind_code(event.kind))
                .bind(json(&event, "policy log")?)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            tx.commit().await.map_err(backend)?;
            Ok(event)
        })
    }
}

impl PolicyCatalog for PgStore {
    fn versions(&self, kind: PolicyKind) -> Result<Vec<PolicyVersion>, StoreError> {
        let pool = self.pool();
        let rows: Vec<Vec<u8>> = self.block(async move {
            sqlx::query_scalar(
                "SELECT record FROM sluice_policy_versions WHERE kind = $1 ORDER BY version",
            )
            .bind(kind_code(kind))
            .fetch_all(&pool)
            .await
            .map_err(backend)
        })?;
        rows.iter().map(|b| parse(b, "policy version")).collect()
    }

    fn module(&self, sha256: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let pool = self.pool();
        let sha256 = sha256.to_owned();
        self.block(async move {
            sqlx::query_scalar("SELECT module FROM sluice_policy_modules WHERE sha256 = $1")
                .bind(sha256)
                .fetch_optional(&pool)
                .await
                .map_err(backend)
        })
    }

    fn add_version(
        &self,
        version: &PolicyVersion,
        module: &[u8],
        event: PolicyEvent,
    ) -> Result<PolicyEvent, StoreError> {
        let write = PolicyWrite::Version {
            sha256: version.sha256.clone(),
            module: module.to_vec(),
            kind: kind_code(version.kind),
            version: i32::try_from(version.version)
                .map_err(|_| corrupt("policy version", "number"))?,
            record: json(version, "policy version")?,
        };
        self.write_policy_event(write, event)
    }

    fn stack(&self, kind: PolicyKind) -> Result<Vec<u32>, StoreError> {
        let pool = self.pool();
        let stack: Option<Vec<u8>> = self.block(async move {
            sqlx::query_scalar("SELECT stack FROM sluice_policy_stacks WHERE kind = $1")
                .bind(kind_code(kind))
                .fetch_optional(&pool)
                .await
                .map_err(backend)
        })?;
        stack.map_or(Ok(Vec::new()), |b| parse(&b, "policy activations"))
    }

    fn set_stack(
        &self,
        kind: PolicyKind,
        stack: &[u32],
        event: PolicyEvent,
    ) -> Result<PolicyEvent, StoreError> {
        let write = PolicyWrite::Stack {
            kind: kind_code(kind),
            stack: json(&stack, "policy activations")?,
        };
        self.write_policy_event(write, event)
    }

    fn events(&self, kind: PolicyKind, limit: usize) -> Result<Vec<PolicyEvent>, StoreError> {
        let pool = self.pool();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows: Vec<Vec<u8>> = self.block(async move {
            sqlx::query_scalar(
                "SELECT event FROM (SELECT seq, event FROM sluice_policy_events WHERE kind = $1 \
                 ORDER BY seq DESC LIMIT $2) newest ORDER BY seq",
            )
            .bind(kind_code(kind))
            .bind(limit)
            .fetch_all(&pool)
            .await
            .map_err(backend)
        })?;
        rows.iter().map(|b| parse(b, "policy log")).collect()
    }

    fn put_data(
        &self,
        version: &PolicyVersion,
        name: &str,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        let pool = self.pool();
        let kind = kind_code(version.kind);
        let number =
            i32::try_from(version.version).map_err(|_| corrupt("policy version", "number"))?;
        let record = json(version, "policy version")?;
        let (name, bytes) = (name.to_owned(), bytes.to_vec());
        self.block(async move {
            let mut tx = pool.begin().await.map_err(backend)?;
            sqlx::query(
                "INSERT INTO sluice_policy_data (kind, version, name, bytes) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (kind, version, name) DO UPDATE SET bytes = excluded.bytes",
            )
            .bind(kind)
            .bind(number)
            .bind(name)
            .bind(bytes)
            .execute(&mut *tx)
            .await.map_err(backend)?;
            sqlx::query("UPDATE sluice_policy_versions SET record = $3 WHERE kind = $1 AND version = $2")
                .bind(kind)
                .bind(number)
                .bind(record)
                .execute(&mut *tx)
                .await.map_err(backend)?;
            tx.commit().await.map_err(backend)?;
            Ok(())
        })
    }

    fn data(&self, kind: PolicyKind, version: u32) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let pool = self.pool();
        let number = i32::try_from(version).map_err(|_| corrupt("policy version", "number"))?;
        self.block(async move {
            sqlx::query_as(
                "SELECT name, bytes FROM sluice_policy_data WHERE kind = $1 AND version = $2 \
                 ORDER BY name",
            )
            .bind(kind_code(kind))
            .bind(number)
            .fetch_all(&pool)
            .await
            .map_err(backend)
        })
    }

    fn compiled(&self, cache_key: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let pool = self.pool();
        let cache_key = cache_key.to_owned();
        self.block(async move {
            sqlx::query_scalar("SELECT code FROM sluice_compiled WHERE cache_key = $1")
                .bind(cache_key)
                .fetch_optional(&pool)
                .await
                .map_err(backend)
        })
    }

    fn put_compiled(&self, cache_key: &str, code: &[u8]) -> Result<(), StoreError> {
        let pool = self.pool();
        let (cache_key, code) = (cache_key.to_owned(), code.to_vec());
        self.block(async move {
            sqlx::query(
                "INSERT INTO sluice_compiled (cache_key, code) VALUES ($1, $2) \
                 ON CONFLICT (cache_key) DO UPDATE SET code = excluded.code",
            )
            .bind(cache_key)
            .bind(code)
            .execute(&pool)
            .await
            .map_err(backend)?;
            Ok(())
        })
    }

    fn experiments(&self) -> Result<Vec<Experiment>, StoreError> {
        let pool = self.pool();
        let rows: Vec<Vec<u8>> = self.block(async move {
            sqlx::query_scalar("SELECT record FROM sluice_experiments ORDER BY id")
                .fetch_all(&pool)
                .await
                .map_err(backend)
        })?;
        rows.iter().map(|b| parse(b, "experiment")).collect()
    }

    fn put_experiment(
        &self,
        experiment: &Experiment,
        event: PolicyEvent,
    ) -> Result<PolicyEvent, StoreError> {
        let write = PolicyWrite::Experiment {
            id: i32::try_from(experiment.id).map_err(|_| corrupt("experiment", "id"))?,
            record: json(experiment, "experiment")?,
        };
        self.write_policy_event(write, event)
    }

    fn concurrency_limits(&self) -> Result<Vec<ConcurrencyLimit>, StoreError> {
        let pool = self.pool();
        let rows: Vec<(String, i32)> = self.block(async move {
            sqlx::query_as("SELECT key, max_running FROM sluice_concurrency_limits ORDER BY key")
                .fetch_all(&pool)
                .await
                .map_err(backend)
        })?;
        rows.into_iter()
            .map(|(key, limit)| {
                let limit = u32::try_from(limit)
                    .map_err(|_| corrupt("concurrency limits", format!("limit {limit}")))?;
                Ok(ConcurrencyLimit { key, limit })
            })
            .collect()
    }

    fn put_concurrency_limits(&self, limits: &[ConcurrencyLimit]) -> Result<(), StoreError> {
        let keys: Vec<String> = limits.iter().map(|l| l.key.clone()).collect();
        let values: Vec<i32> = limits
            .iter()
            .map(|l| i32::try_from(l.limit).unwrap_or(i32::MAX))
            .collect();
        let pool = self.pool();
        self.block(async move {
            let mut tx = pool.begin().await.map_err(backend)?;
            sqlx::query("DELETE FROM sluice_concurrency_limits")
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            sqlx::query(
                "INSERT INTO sluice_concurrency_limits (key, max_running) \
                 SELECT * FROM UNNEST($1::text[], $2::int4[])",
            )
            .bind(keys)
            .bind(values)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
            tx.commit().await.map_err(backend)?;
            Ok(())
        })
    }

    fn collections(&self) -> Result<Vec<Collection>, StoreError> {
        let pool = self.pool();
        let rows: Vec<(String,)> = self.block(async move {
            sqlx::query_as("SELECT record::text FROM sluice_collections ORDER BY name")
                .fetch_all(&pool)
                .await
                .map_err(backend)
        })?;
        rows.into_iter()
            .map(|(record,)| parse(record.as_bytes(), "collection"))
            .collect()
    }

    fn put_collections(&self, collections: &[Collection]) -> Result<(), StoreError> {
        let names: Vec<String> = collections.iter().map(|c| c.name.clone()).collect();
        let records = collections
            .iter()
            .map(|c| serde_json::to_string(c).map_err(|e| corrupt("collection", e)))
            .collect::<Result<Vec<String>, StoreError>>()?;
        let pool = self.pool();
        self.block(async move {
            let mut tx = pool.begin().await.map_err(backend)?;
            sqlx::query("DELETE FROM sluice_collections")
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            sqlx::query(
                "INSERT INTO sluice_collections (name, record) \
                 SELECT name, record::jsonb FROM UNNEST($1::text[], $2::text[]) AS t(name, record)",
            )
            .bind(names)
            .bind(records)
            .execute(&mut *tx)
            .await
            .map_err(backend)?;
            tx.commit().await.map_err(backend)?;
            Ok(())
        })
    }
}

impl PgStore {
    /// Writes `token` (when given) and appends `event`, numbered here, trimming the oldest
    /// entry past the bound, in one transaction.
    fn write_audited(
        &self,
        token: Option<(String, Vec<u8>)>,
        mut event: AuditEvent,
    ) -> Result<AuditEvent, StoreError> {
        let pool = self.pool();
        let _writing = self
            .catalog_writes
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        self.block(async move {
            let mut tx = pool.begin().await.map_err(backend)?;
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(AUDIT_LOG_LOCK)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            let last: i64 = sqlx::query_scalar("SELECT coalesce(max(seq), 0) FROM sluice_audit")
                .fetch_one(&mut *tx)
                .await
                .map_err(backend)?;
            event.seq = uint8(last, "audit log")? + 1;
            if let Some((id, record)) = token {
                sqlx::query(
                    "INSERT INTO sluice_tokens (id, record) VALUES ($1, $2) \
                     ON CONFLICT (id) DO UPDATE SET record = excluded.record",
                )
                .bind(id)
                .bind(record)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            }
            sqlx::query("INSERT INTO sluice_audit (seq, event) VALUES ($1, $2)")
                .bind(int8(event.seq))
                .bind(json(&event, "audit log")?)
                .execute(&mut *tx)
                .await
                .map_err(backend)?;
            if event.seq > MAX_AUDIT_EVENTS {
                sqlx::query("DELETE FROM sluice_audit WHERE seq <= $1")
                    .bind(int8(event.seq - MAX_AUDIT_EVENTS))
                    .execute(&mut *tx)
                    .await
                    .map_err(backend)?;
            }
            tx.commit().await.map_err(backend)?;
            Ok(event)
        })
    }
}

impl AccessCatalog for PgStore {
    fn tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        let pool = self.pool();
        let rows: Vec<Vec<u8>> = self.block(async move {
            sqlx::query_scalar("SELECT record FROM sluice_tokens ORDER BY id")
                .fetch_all(&pool)
                .await
                .map_err(backend)
        })?;
        rows.iter().map(|b| parse(b, "token record")).collect()
    }

    fn put_token(&self, token: &TokenRecord, event: AuditEvent) -> Result<AuditEvent, StoreError> {
        let record = json(token, "token record")?;
        self.write_audited(Some((token.id.clone(), record)), event)
    }

    fn append_audit(&self, event: AuditEvent) -> Result<AuditEvent, StoreError> {
        self.write_audited(None, event)
    }

    fn audit_after(&self, after_seq: u64, limit: usize) -> Result<Vec<AuditEvent>, StoreError> {
        let pool = self.pool();
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows: Vec<Vec<u8>> = self.block(async move {
            sqlx::query_scalar(
                "SELECT event FROM sluice_audit WHERE seq > $1 ORDER BY seq LIMIT $2",
            )
            .bind(int8(after_seq))
            .bind(limit)
            .fetch_all(&pool)
            .await
            .map_err(backend)
        })?;
        rows.iter().map(|b| parse(b, "audit log")).collect()
    }
}
