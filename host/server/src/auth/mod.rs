//! Bearer tokens: issuing them (random, shown once, stored as hashes), checking them, revoking
//! them, and the principal a request acts as. Policy signatures live in `signing`.
//!
//! Auth is on once a bootstrap admin is configured (`SLUICE_ADMIN_TOKEN`,
//! `admin_token_sha256`) or any token has ever been issued; until then (a fresh server on
//! loopback) every request acts as the open admin, as before tokens existed. It never turns
//! off again by itself: revoking or outliving every token leaves a server no one can enter
//! rather than one anyone can, and the bootstrap admin is the way back in.

pub mod signing;

use rand::RngCore;
use sha2::{Digest, Sha256};
use sluice_model::{
    Actor, AuditEvent, Role, Task, TokenRecord, ValidationError, check_name, check_worker_id,
};
use sluice_store::{AccessCatalog, StoreError};
pub use sluice_wire::TokenRequest;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

/// Token records kept, revoked ones included: each is a few hundred bytes.
pub const MAX_TOKENS: usize = 100_000;
/// The longest a token may be issued for.
pub const MAX_EXPIRES_IN_S: u64 = 10 * 365 * 24 * 3600;
/// The prefix of every token's text, so a leaked one is easy to recognise in a scan.
pub const TOKEN_PREFIX: &str = "sluice_";
/// The id the bootstrap admin acts as in the audit log.
pub const BOOTSTRAP_ID: &str = "bootstrap";
/// The id every request acts as while auth is off.
pub const OPEN_ID: &str = "open";

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("this request needs an `Authorization: Bearer TOKEN` header")]
    Missing,
    #[error("the Authorization header must be `Bearer TOKEN`")]
    Malformed,
    /// Unknown, revoked and expired tokens are told apart only in the log.
    #[error("the token is unknown, revoked or expired")]
    Refused,
    #[error("a {role} token may not do this")]
    Forbidden { role: Role },
    #[error("no token {0}")]
    NotFound(String),
    #[error("invalid token request: {0}")]
    Invalid(String),
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<ValidationError> for AuthError {
    fn from(error: ValidationError) -> Self {
        AuthError::Invalid(error.to_string())
    }
}

/// Who a request acts as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub token_id: String,
    pub role: Role,
    pub device: Option<String>,
    pub tenant: Option<String>,
    pub worker: Option<String>,
}

impl Principal {
    /// Every request while auth is off.
    pub fn open() -> Principal {
        Self::admin(OPEN_ID)
    }

    fn admin(id: &str) -> Principal {
        Principal {
            token_id: id.to_owned(),
            role: Role::Admin,
            device: None,
            tenant: None,
            worker: None,
        }
    }

    fn of(record: &TokenRecord) -> Principal {
        Principal {
            token_id: record.id.clone(),
            role: record.role,
            device: record.device.clone(),
            tenant: record.tenant.clone(),
            worker: record.worker.clone(),
        }
    }

    /// Whether this principal may see `task`: a device sees only its own (device and tenant);
    /// every other role that reaches a task route sees all.
    pub fn sees(&self, task: &Task) -> bool {
        match self.role {
            Role::Device => {
                self.device.as_deref() == Some(task.device.as_str())
                    && self.tenant.as_deref() == Some(task.tenant.as_str())
            }
            _ => true,
        }
    }

    /// Whether this principal may act as worker `id`: a worker token only as its own.
    pub fn acts_as_worker(&self, id: &str) -> bool {
        match self.role {
            Role::Worker => self.worker.as_deref() == Some(id),
            _ => true,
        }
    }

    /// The actor events name for what this principal does.
    pub fn actor(&self) -> Actor {
        match (self.role, &self.device, &self.worker) {
            (Role::Device, Some(device), _) => Actor::device(device),
            (Role::Worker, _, Some(worker)) => Actor::worker(worker),
            _ if self.token_id == OPEN_ID => Actor::api(),
            _ => Actor::new(format!("{}:{}", self.role, self.token_id)),
        }
    }

    /// An audit entry of an action of this principal's.
    pub fn audit(&self, action: &str, target: String, detail: Option<String>) -> AuditEvent {
        AuditEvent {
            seq: 0,
            at_ms: now_ms(),
            token_id: self.token_id.clone(),
            role: self.role,
            action: action.to_owned(),
            target,
            detail,
        }
    }
}

/// A token just issued: its text (shown this once) and its record.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Issued {
    pub token: String,
    #[serde(flatten)]
    pub record: TokenRecord,
}

/// Hex SHA-256 of a token's text: what the store keeps and the config's
/// `admin_token_sha256` holds.
pub fn token_sha256(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn now_ms() -> u64 {
    crate::scheduler::Clock::now_ms(&crate::scheduler::SystemClock)
}

/// The token table, loaded from the store at start and written through on every change.
pub struct Gate {
    catalog: Arc<dyn AccessCatalog>,
    bootstrap_sha256: Option<String>,
    /// By the hash of the token's text.
    by_hash: RwLock<HashMap<String, TokenRecord>>,
    enforced: AtomicBool,
    /// `--insecure-no-auth`: every request is the open admin, whatever is configured.
    disabled: bool,
}

impl Gate {
    /// `bootstrap_sha256` is the hex SHA-256 of the bootstrap admin token, when configured.
    pub fn open(
        catalog: Arc<dyn AccessCatalog>,
        bootstrap_sha256: Option<String>,
        disabled: bool,
    ) -> Result<Gate, AuthError> {
        if let Some(hash) = &bootstrap_sha256
            && (hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()))
        {
            return Err(AuthError::Invalid(
                "admin_token_sha256 must be 64 hex digits".into(),
            ));
        }
        let bootstrap_sha256 = bootstrap_sha256.map(|h| h.to_ascii_lowercase());
        let tokens = catalog.tokens()?;
        let enforced = bootstrap_sha256.is_some() || !tokens.is_empty();
        let by_hash = tokens.into_iter().map(|t| (t.sha256.clone(), t)).collect();
        Ok(Gate {
            catalog,
            bootstrap_sha256,
            by_hash: RwLock::new(by_hash),
            enforced: AtomicBool::new(enforced),
            disabled,
        })
    }

    /// Whether requests must carry a token.
    pub fn is_enforced(&self) -> bool {
        !self.disabled && self.enforced.load(Ordering::Acquire)
    }

    /// The principal of a request's `Authorization` header.
    pub fn check(&self, authorization: Option<&[u8]>) -> Result<Principal, AuthError> {
        if !self.is_enforced() {
            return Ok(Principal::open());
        }
        let header = authorization.ok_or(AuthError::Missing)?;
        let text = std::str::from_utf8(header).map_err(|_| AuthError::Malformed)?;
        let token = text
            .strip_prefix("Bearer ")
            .or_else(|| text.strip_prefix("bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or(AuthError::Malformed)?;
        let hash = token_sha256(token);
        if self.bootstrap_sha256.as_deref() == Some(hash.as_str()) {
            return Ok(Principal::admin(BOOTSTRAP_ID));
        }
        let table = self.by_hash.read().map_err(|_| poisoned())?;
        match table.get(&hash) {
            Some(record) if record.is_live(now_ms()) => Ok(Principal::of(record)),
            Some(record) => {
                tracing::debug!(token_id = %record.id, "refused a revoked or expired token");
                Err(AuthError::Refused)
            }
            None => Err(AuthError::Refused),
        }
    }

    /// Issues a token as `by` asks; the token's text is in the answer only.
    pub fn issue(&self, request: TokenRequest, by: &Principal) -> Result<Issued, AuthError> {
        let now = now_ms();
        let role = request
            .role
            .ok_or_else(|| AuthError::Invalid("`role` is required".into()))?;
        let bound = |name: &str, value: &Option<String>| match value {
            Some(_) => Err(AuthError::Invalid(format!(
                "a {role} token is not bound to a {name}"
            ))),
            None => Ok(()),
        };
        let (device, tenant, worker) = match role {
            Role::Device => {
                bound("worker", &request.worker)?;
                let device = request
                    .device
                    .ok_or_else(|| AuthError::Invalid("a device token needs `device`".into()))?;
                check_name("device", &device)?;
                let tenant = request.tenant.unwrap_or_else(|| "default".to_owned());
                check_name("tenant", &tenant)?;
                (Some(device), Some(tenant), None)
            }
            Role::Worker => {
                bound("device", &request.device)?;
                bound("tenant", &request.tenant)?;
                let worker = request
                    .worker
                    .ok_or_else(|| AuthError::Invalid("a worker token needs `worker`".into()))?;
                check_worker_id(&worker)?;
                (None, None, Some(worker))
            }
            Role::Admin | Role::Viewer => {
                bound("device", &request.device)?;
                bound("tenant", &request.tenant)?;
                bound("worker", &request.worker)?;
                (None, None, None)
            }
        };
        let expires_at_ms = match request.expires_in_s {
            Some(0) => {
                return Err(AuthError::Invalid(
                    "`expires_in_s` must be at least 1".into(),
                ));
            }
            Some(s) if s > MAX_EXPIRES_IN_S => {
                return Err(AuthError::Invalid(format!(
                    "`expires_in_s` may be at most {MAX_EXPIRES_IN_S}"
                )));
            }
            Some(s) => Some(now + s * 1000),
            None => None,
        };
        if !self.is_enforced() && role != Role::Admin {
            return Err(AuthError::Conflict(
                "auth is off: the first token must be an admin token (issuing it turns auth on)"
                    .into(),
            ));
        }
        let mut secret = [0u8; 32];
        rand::rng().fill_bytes(&mut secret);
        let mut id_bytes = [0u8; 8];
        rand::rng().fill_bytes(&mut id_bytes);
        let token = format!("{TOKEN_PREFIX}{}", hex(&secret));
        let record = TokenRecord {
            id: format!("tok_{}", hex(&id_bytes)),
            role,
            device,
            tenant,
            worker,
            sha256: token_sha256(&token),
            created_at_ms: now,
            expires_at_ms,
            revoked_at_ms: None,
            issued_by: by.token_id.clone(),
        };
        let mut table = self.by_hash.write().map_err(|_| poisoned())?;
        if table.len() >= MAX_TOKENS {
            return Err(AuthError::Conflict(format!(
                "{MAX_TOKENS} tokens are stored, the most there may be"
            )));
        }
        let detail = Some(describe(&record));
        self.catalog
            .put_token(&record, by.audit("token.issue", record.id.clone(), detail))?;
        table.insert(record.sha256.clone(), record.clone());
        self.enforced.store(true, Ordering::Release);
        Ok(Issued { token, record })
    }

    /// Every token's record, newest last.
    pub fn list(&self) -> Result<Vec<TokenRecord>, AuthError> {
        let table = self.by_hash.read().map_err(|_| poisoned())?;
        let mut records: Vec<_> = table.values().cloned().collect();
        records.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        Ok(records)
    }

    /// Revokes token `id` at once. The last live admin token cannot be revoked while no
    /// bootstrap admin is configured: that would lock every admin out.
    pub fn revoke(&self, id: &str, by: &Principal) -> Result<TokenRecord, AuthError> {
        let now = now_ms();
        let mut table = self.by_hash.write().map_err(|_| poisoned())?;
        let record = table
            .values()
            .find(|r| r.id == id)
            .cloned()
            .ok_or_else(|| AuthError::NotFound(id.to_owned()))?;
        if record.revoked_at_ms.is_some() {
            return Ok(record);
        }
        let other_admins = table
            .values()
            .filter(|r| r.role == Role::Admin && r.id != id && r.is_live(now))
            .count();
        if record.role == Role::Admin && other_admins == 0 && self.bootstrap_sha256.is_none() {
            return Err(AuthError::Conflict(
                "this is the last admin token and no bootstrap admin is configured; issue another admin token first".into(),
            ));
        }
        let mut revoked = record;
        revoked.revoked_at_ms = Some(now);
        self.catalog
            .put_token(&revoked, by.audit("token.revoke", revoked.id.clone(), None))?;
        table.insert(revoked.sha256.clone(), revoked.clone());
        Ok(revoked)
    }

    /// Logs an admin action done elsewhere (a policy change, a worker reset).
    pub fn audit(&self, event: AuditEvent) -> Result<AuditEvent, AuthError> {
        Ok(self.catalog.append_audit(event)?)
    }

    pub fn audit_after(&self, after_seq: u64, limit: usize) -> Result<Vec<AuditEvent>, AuthError> {
        Ok(self.catalog.audit_after(after_seq, limit)?)
    }
}

fn describe(record: &TokenRecord) -> String {
    let mut text = format!("role={}", record.role);
    for (name, value) in [
        ("device", &record.device),
        ("tenant", &record.tenant),
        ("worker", &record.worker),
    ] {
        if let Some(value) = value {
            text.push_str(&format!(" {name}={value}"));
        }
    }
    if let Some(end) = record.expires_at_ms {
        text.push_str(&format!(" expires_at_ms={end}"));
    }
    text
}

fn poisoned() -> AuthError {
    AuthError::Store(StoreError::Failed(
        "the token table's lock was poisoned".into(),
    ))
}

#[cfg(test)]
mod tests;
