//! Submissions: the request body of a new task, its validation and its fingerprint.

use super::Priority;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// What a task needs from the worker that runs it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// GPU memory the task needs on the GPU it runs on (its model's included).
    #[serde(default)]
    pub gpu_memory_mb: u64,
    /// The model it runs: a worker that says it has it loaded is preferred (warm placement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9._:/@-]{1,128}$"))]
    pub model: Option<String>,
    /// What, beside the kind and the model, a task must share with others to run in one GPU
    /// batch with them (an input shape, say `512x496`): a worker claiming batches gets tasks
    /// of one kind, model and batch key together. None batches with the others that have none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9._:/@-]{1,128}$"))]
    pub batch_key: Option<String>,
}

/// The body of `POST /v1/tasks`. Unknown fields are refused so that a typo is an error, not a
/// silently ignored setting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// An idempotency key: a resend with the same key and body answers the same task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(min_length = 1, max_length = 256))]
    pub key: Option<String>,
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9._:/@-]{1,128}$"))]
    pub kind: String,
    #[serde(default)]
    pub priority: Priority,
    /// Replaced by the device token's device when auth is on.
    #[serde(default = "default_device")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9._:/@-]{1,128}$"))]
    pub device: String,
    /// Replaced by the device token's tenant when auth is on.
    #[serde(default = "default_tenant")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9._:/@-]{1,128}$"))]
    pub tenant: String,
    /// At most 64.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default = "default_est_exec_ms")]
    #[cfg_attr(feature = "openapi", schema(maximum = 604_800_000))]
    pub est_exec_ms: u64,
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 2_592_000_000_u64))]
    pub deadline_ms: Option<u64>,
    #[serde(default = "default_max_attempts")]
    #[cfg_attr(feature = "openapi", schema(minimum = 1, maximum = 100))]
    pub max_attempts: u32,
    #[serde(default)]
    pub payload: serde_json::Value,
    #[serde(default)]
    pub callback_url: Option<String>,
    #[serde(default)]
    pub resources: Resources,
    /// Tasks with the same key run at most as many at once as the key's limit (set in the
    /// configuration or `PUT /v1/concurrency-limits/{key}`), e.g. `scanner-7` or
    /// `model:seg-v3`; without a limit, no bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(pattern = "^[A-Za-z0-9._:/@-]{1,128}$"))]
    pub concurrency_key: Option<String>,
    /// Whether an urgent task may stop this one's attempt to take its GPU (when preemption is
    /// on); the attempt is not counted against `max_attempts`. Urgent tasks never are.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub preemptible: bool,
}

fn yes() -> bool {
    true
}

/// Serde's skip test for fields that default to true, so that records and fingerprints of
/// tasks that leave them alone stay as they were.
pub(crate) fn is_true(value: &bool) -> bool {
    *value
}

fn default_device() -> String {
    "unknown".to_owned()
}

fn default_tenant() -> String {
    "default".to_owned()
}

fn default_est_exec_ms() -> u64 {
    60_000
}

fn default_max_attempts() -> u32 {
    3
}

/// Bounds on a submission. Every field of a task is bounded so that one request cannot exhaust
/// memory or disk.
#[derive(Clone, Debug)]
pub struct Limits {
    pub max_payload_bytes: usize,
    /// Private destinations a `callback_url` may name all the same.
    pub callback_allow: super::CallbackAllow,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_payload_bytes: 1024 * 1024,
            callback_allow: super::CallbackAllow::default(),
        }
    }
}

const MAX_NAME_LEN: usize = 128;
const MAX_KEY_LEN: usize = 256;
const MAX_LABELS: usize = 64;
const MAX_LABEL_LEN: usize = 256;
const MAX_URL_LEN: usize = 2048;
pub const MAX_ATTEMPTS: u32 = 100;
const MAX_EST_EXEC_MS: u64 = 7 * 24 * 3_600_000;
const MAX_DEADLINE_MS: u64 = 30 * 24 * 3_600_000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("field `{field}`: {reason}")]
    Field { field: &'static str, reason: String },
    #[error("payload is {size} bytes, more than the limit of {limit}")]
    PayloadTooLarge { size: usize, limit: usize },
}

pub(super) fn field(field: &'static str, reason: impl Into<String>) -> ValidationError {
    ValidationError::Field {
        field,
        reason: reason.into(),
    }
}

pub fn check_name(name: &'static str, value: &str) -> Result<(), ValidationError> {
    if value.is_empty() || value.len() > MAX_NAME_LEN {
        return Err(field(name, format!("must be 1 to {MAX_NAME_LEN} bytes")));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || "._-:/@".contains(c);
    if !value.chars().all(allowed) {
        return Err(field(
            name,
            "may hold only ASCII letters, digits and . _ - : / @",
        ));
    }
    Ok(())
}

/// Checks an idempotency key, from the body or the `Idempotency-Key` header.
pub fn check_key(key: &str) -> Result<(), ValidationError> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(field("key", format!("must be 1 to {MAX_KEY_LEN} bytes")));
    }
    if key.chars().any(|c| c.is_control()) {
        return Err(field("key", "must not contain control characters"));
    }
    Ok(())
}

/// A validated submission, ready for the scheduler: the payload is serialized once, and the
/// fingerprint identifies the body for idempotent replays.
#[derive(Clone, Debug)]
pub struct Submission {
    pub spec: TaskSpec,
    pub payload_json: Vec<u8>,
    pub fingerprint: [u8; 32],
    /// Who submitted it when that was not its device (an admin's token): the task's creation
    /// event names them rather than the device the body names.
    pub submitted_by: Option<super::Actor>,
}

impl TaskSpec {
    /// Validates the spec and prepares it for the scheduler. `header_key` is the
    /// `Idempotency-Key` header, which must agree with the `key` field when both are given.
    pub fn into_submission(
        mut self,
        header_key: Option<String>,
        limits: &Limits,
    ) -> Result<Submission, ValidationError> {
        match (&self.key, header_key) {
            (Some(body), Some(header)) if *body != header => {
                return Err(field(
                    "key",
                    "differs from the Idempotency-Key header; send one or make them equal",
                ));
            }
            (None, Some(header)) => self.key = Some(header),
            _ => {}
        }
        self.validate()?;
        if let Some(url) = &self.callback_url {
            check_callback_destination(url, &limits.callback_allow)?;
        }
        let payload_json =
            serde_json::to_vec(&self.payload).map_err(|e| field("payload", e.to_string()))?;
        if payload_json.len() > limits.max_payload_bytes {
            return Err(ValidationError::PayloadTooLarge {
                size: payload_json.len(),
                limit: limits.max_payload_bytes,
            });
        }
        let fingerprint = self.fingerprint();
        Ok(Submission {
            spec: self,
            payload_json,
            fingerprint,
            submitted_by: None,
        })
    }

    fn validate(&self) -> Result<(), ValidationError> {
        if let Some(key) = &self.key {
            check_key(key)?;
        }
        check_name("kind", &self.kind)?;
        check_name("device", &self.device)?;
        check_name("tenant", &self.tenant)?;
        if let Some(key) = &self.concurrency_key {
            check_name("concurrency_key", key)?;
        }
        if let Some(model) = &self.resources.model {
            check_name("resources.model", model)?;
        }
        if let Some(batch_key) = &self.resources.batch_key {
            check_name("resources.batch_key", batch_key)?;
        }
        if self.labels.len() > MAX_LABELS {
            return Err(field("labels", format!("at most {MAX_LABELS} labels")));
        }
        for (name, value) in &self.labels {
            if name.is_empty() || name.len() > MAX_LABEL_LEN || value.len() > MAX_LABEL_LEN {
                return Err(field(
                    "labels",
                    format!(
                        "names must be 1 to {MAX_LABEL_LEN} bytes, values at most {MAX_LABEL_LEN}"
                    ),
                ));
            }
        }
        if self.est_exec_ms > MAX_EST_EXEC_MS {
            return Err(field("est_exec_ms", format!("at most {MAX_EST_EXEC_MS}")));
        }
        if let Some(deadline) = self.deadline_ms
            && (deadline == 0 || deadline > MAX_DEADLINE_MS)
        {
            return Err(field(
                "deadline_ms",
                format!("must be 1 to {MAX_DEADLINE_MS}"),
            ));
        }
        if self.max_attempts == 0 || self.max_attempts > MAX_ATTEMPTS {
            return Err(field(
                "max_attempts",
                format!("must be 1 to {MAX_ATTEMPTS}"),
            ));
        }
        if let Some(url) = &self.callback_url {
            check_callback_url(url)?;
        }
        Ok(())
    }

    /// A digest of everything but the key. serde_json's maps are sorted, so two bodies that
    /// differ only in field order or whitespace have the same fingerprint.
    fn fingerprint(&self) -> [u8; 32] {
        let mut unkeyed = self.clone();
        unkeyed.key = None;
        let mut hasher = Sha256::new();
        // Serializing plain data with string keys cannot fail.
        if let Ok(bytes) = serde_json::to_vec(&unkeyed) {
            hasher.update(bytes);
        }
        hasher.finalize().into()
    }
}

fn check_callback_url(text: &str) -> Result<(), ValidationError> {
    if text.len() > MAX_URL_LEN {
        return Err(field(
            "callback_url",
            format!("at most {MAX_URL_LEN} bytes"),
        ));
    }
    let url = url::Url::parse(text).map_err(|e| field("callback_url", e.to_string()))?;
    if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
        return Err(field(
            "callback_url",
            "must be an http or https URL with a host",
        ));
    }
    Ok(())
}

/// Refuses a callback to a loopback, private or link-local address, or to a `localhost` name,
/// unless `allow` names it. (Names are checked again when the deliverer resolves them.)
fn check_callback_destination(
    text: &str,
    allow: &super::CallbackAllow,
) -> Result<(), ValidationError> {
    let url = url::Url::parse(text).map_err(|e| field("callback_url", e.to_string()))?;
    let refused = match url.host() {
        Some(url::Host::Ipv4(v4)) => !allow.permits(&v4.to_string(), v4.into()),
        Some(url::Host::Ipv6(v6)) => !allow.permits(&v6.to_string(), v6.into()),
        Some(url::Host::Domain(name)) => super::is_local_name(name) && !allow.allows_host(name),
        None => true,
    };
    if refused {
        return Err(field(
            "callback_url",
            "names a loopback, private or link-local destination; the server's \
             `callback_allow` setting must name it first",
        ));
    }
    Ok(())
}

impl Submission {
    /// The host's own admission of this submission (see `Admission::native`).
    pub fn native_admission(&self, seq: u64) -> super::Admission {
        super::Admission::native(self.spec.priority, self.spec.est_exec_ms, seq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> TaskSpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn fingerprint_ignores_key_field_order_and_whitespace() {
        let limits = Limits::default();
        let a = spec(serde_json::json!({"kind": "oct.scan", "payload": {"a": 1, "b": [1, 2]}}))
            .into_submission(Some("k1".into()), &limits)
            .unwrap();
        let b: TaskSpec = serde_json::from_str(
            r#"{ "payload": {"b":[1,2],"a":1}, "key": "k1", "kind":"oct.scan" }"#,
        )
        .unwrap();
        let b = b.into_submission(None, &limits).unwrap();
        assert_eq!(a.fingerprint, b.fingerprint);
        assert_eq!(a.spec.key.as_deref(), Some("k1"));
        let c = spec(serde_json::json!({"kind": "oct.scan", "payload": {"a": 2, "b": [1, 2]}}))
            .into_submission(None, &limits)
            .unwrap();
        assert_ne!(a.fingerprint, c.fingerprint);
    }

    #[test]
    fn bounds_are_enforced() {
        let limits = Limits {
            max_payload_bytes: 16,
            ..Limits::default()
        };
        let bad = [
            serde_json::json!({"kind": ""}),
            serde_json::json!({"kind": "has space"}),
            serde_json::json!({"kind": "k", "max_attempts": 0}),
            serde_json::json!({"kind": "k", "deadline_ms": 0}),
            serde_json::json!({"kind": "k", "callback_url": "ftp://x"}),
            serde_json::json!({"kind": "k", "key": ""}),
            serde_json::json!({"kind": "k", "payload": "this string is longer than sixteen bytes"}),
        ];
        for body in bad {
            assert!(
                spec(body.clone()).into_submission(None, &limits).is_err(),
                "{body}"
            );
        }
        let conflict = spec(serde_json::json!({"kind": "k", "key": "a"}))
            .into_submission(Some("b".into()), &limits);
        assert!(conflict.is_err());
        assert!(
            spec(serde_json::json!({"kind": "k"}))
                .into_submission(None, &limits)
                .is_ok()
        );
    }
}
