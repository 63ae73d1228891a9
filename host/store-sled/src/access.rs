//! Tokens and the audit log in sled: a tree of their own, each write one atomic batch followed
//! by the store's `sync`, so an issued token or a revocation survives a crash once answered.
//!
//! Keys: `t`+id → token record; `a`+seq → audit entry. The log keeps its newest
//! `MAX_AUDIT_EVENTS` entries.

use super::SledStore;
use super::util::{corrupt, lock};
use crate::sled_error;
use sluice_model::{AuditEvent, TokenRecord};
use sluice_store::{AccessCatalog, MAX_AUDIT_EVENTS, StoreError};

fn token_key(id: &str) -> Vec<u8> {
    [b"t".as_slice(), id.as_bytes()].concat()
}

fn audit_key(seq: u64) -> Vec<u8> {
    [b"a".as_slice(), &seq.to_be_bytes()].concat()
}

fn json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, StoreError> {
    serde_json::to_vec(value).map_err(|e| corrupt("access record", e))
}

impl SledStore {
    fn next_audit_seq(&self) -> Result<u64, StoreError> {
        match self.access.scan_prefix(b"a").next_back() {
            Some(entry) => {
                let (key, _) = entry.map_err(sled_error)?;
                key.get(1..9)
                    .and_then(|b| b.try_into().ok())
                    .map(|b| u64::from_be_bytes(b) + 1)
                    .ok_or_else(|| corrupt("audit log", "short key"))
            }
            None => Ok(1),
        }
    }

    /// Writes `batch` with `event` appended (its `seq` assigned), trimming the oldest entry
    /// past the bound, then syncs.
    fn write_audited(
        &self,
        mut batch: sled::Batch,
        mut event: AuditEvent,
    ) -> Result<AuditEvent, StoreError> {
        self.shared.space.check(0)?;
        // One writer at a time, so two admin actions never take the same seq.
        let _writing = lock(&self.access_writes);
        event.seq = self.next_audit_seq()?;
        batch.insert(audit_key(event.seq), json(&event)?);
        if event.seq > MAX_AUDIT_EVENTS {
            batch.remove(audit_key(event.seq - MAX_AUDIT_EVENTS));
        }
        self.access.apply_batch(batch).map_err(sled_error)?;
        self.sync_sled()?;
        Ok(event)
    }
}

impl AccessCatalog for SledStore {
    fn tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        self.access
            .scan_prefix(b"t")
            .map(|entry| {
                let (_, bytes) = entry.map_err(sled_error)?;
                serde_json::from_slice(&bytes).map_err(|e| corrupt("token record", e))
            })
            .collect()
    }

    fn put_token(&self, token: &TokenRecord, event: AuditEvent) -> Result<AuditEvent, StoreError> {
        let mut batch = sled::Batch::default();
        batch.insert(token_key(&token.id), json(token)?);
        self.write_audited(batch, event)
    }

    fn append_audit(&self, event: AuditEvent) -> Result<AuditEvent, StoreError> {
        self.write_audited(sled::Batch::default(), event)
    }

    fn audit_after(&self, after_seq: u64, limit: usize) -> Result<Vec<AuditEvent>, StoreError> {
        self.access
            .range(audit_key(after_seq.saturating_add(1))..audit_key(u64::MAX))
            .take(limit)
            .map(|entry| {
                let (_, bytes) = entry.map_err(sled_error)?;
                serde_json::from_slice(&bytes).map_err(|e| corrupt("audit log", e))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SledOptions;
    use sluice_model::Role;

    fn token(id: &str) -> TokenRecord {
        TokenRecord {
            id: id.into(),
            role: Role::Device,
            device: Some("scanner-1".into()),
            tenant: Some("site-a".into()),
            worker: None,
            sha256: "ab".repeat(32),
            created_at_ms: 5,
            expires_at_ms: None,
            revoked_at_ms: None,
            issued_by: "bootstrap".into(),
        }
    }

    fn event(action: &str, target: &str) -> AuditEvent {
        AuditEvent {
            seq: 0,
            at_ms: 7,
            token_id: "bootstrap".into(),
            role: Role::Admin,
            action: action.into(),
            target: target.into(),
            detail: None,
        }
    }

    #[test]
    fn tokens_and_their_audit_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = SledStore::open(dir.path(), &SledOptions::default()).unwrap();
            let first = store
                .put_token(&token("tok1"), event("token.issue", "tok1"))
                .unwrap();
            assert_eq!(first.seq, 1);
            let mut revoked = token("tok1");
            revoked.revoked_at_ms = Some(9);
            let second = store
                .put_token(&revoked, event("token.revoke", "tok1"))
                .unwrap();
            assert_eq!(second.seq, 2);
            store.append_audit(event("worker.reset", "gpu-1")).unwrap();
        }
        let store = SledStore::reopen(dir.path(), &SledOptions::default()).unwrap();
        let tokens = store.tokens().unwrap();
        assert_eq!(tokens.len(), 1);
        assert_eq!(tokens[0].revoked_at_ms, Some(9));
        let log = store.audit_after(0, 10).unwrap();
        let actions: Vec<_> = log.iter().map(|e| (e.seq, e.action.as_str())).collect();
        assert_eq!(
            actions,
            [(1, "token.issue"), (2, "token.revoke"), (3, "worker.reset")]
        );
        assert_eq!(store.audit_after(2, 10).unwrap().len(), 1);
        assert_eq!(store.audit_after(0, 1).unwrap().len(), 1);
    }
}
