//! A typed HTTP client of the Sluice API, for the CLI, the benchmarks and embedding programs,
//! and (`worker`) the worker client a GPU service embeds. It speaks the types of `sluice-wire`
//! and compiles none of the server: no wasmtime, no store, no axum.

pub mod worker;

// The model's types a client names, so one dependency is enough to embed the worker.
pub use sluice_model::{FailureClass, Gpu, Heartbeat, LoadedModel, Priority, TaskId, TaskSpec};
pub use sluice_wire::{BatchRequest, ClaimResponse, LeaseGrant, LeaseView, TaskView};

use serde::Deserialize;
use serde_json::Value;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{title} ({status}): {detail}")]
    Problem {
        status: u16,
        kind: String,
        title: String,
        detail: String,
    },
    #[error("cannot reach {url}: {source}")]
    Http { url: String, source: reqwest::Error },
    #[error("unexpected answer ({status}) from {url}: {body}")]
    Unexpected {
        url: String,
        status: u16,
        body: String,
    },
    #[error("invalid server URL `{0}`: use http://HOST:PORT or https://HOST:PORT")]
    BadUrl(String),
    #[error("invalid credentials: {0}")]
    BadCredentials(String),
}

impl ClientError {
    /// Whether the server may have acted on the request although no answer said so: the
    /// connection failed, or a 5xx (a replica that forwarded it to a leader that then died).
    /// A 4xx was refused, so it did not.
    pub fn may_have_landed(&self) -> bool {
        match self {
            ClientError::Http { .. } => true,
            ClientError::Problem { status, .. } | ClientError::Unexpected { status, .. } => {
                *status >= 500
            }
            ClientError::BadUrl(_) | ClientError::BadCredentials(_) => false,
        }
    }
}

/// How a client proves who it is and whom it trusts.
#[derive(Clone, Debug, Default)]
pub struct Credentials {
    /// Sent as `Authorization: Bearer TOKEN` on every request.
    pub token: Option<String>,
    /// PEM CA certificates the server's certificate may be signed by, beside the system's.
    pub ca_cert_pem: Option<Vec<u8>>,
}

#[derive(Deserialize)]
struct ProblemBody {
    #[serde(rename = "type", default)]
    kind: String,
    #[serde(default)]
    title: String,
    #[serde(default)]
    detail: String,
}

/// The answer to a submission.
#[derive(Debug, Clone)]
pub struct SubmitAnswer {
    pub task: TaskView,
    /// True when the key already named this task and nothing new was created.
    pub replayed: bool,
}

/// How long an upload of a policy component or its data may take to its answer. The server
/// compiles and checks a component before it answers (an interpreted one is tens of MiB), and
/// bounds that with its own `request_timeout_ms`; this only keeps the client from giving up
/// first.
const POLICY_UPLOAD_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Clone, Debug)]
pub struct Client {
    http: reqwest::Client,
    base: String,
}

impl Client {
    pub fn new(base_url: &str) -> Result<Client, ClientError> {
        Self::with_pool(base_url, 16)
    }

    /// A client keeping up to `idle_connections` open connections, for many concurrent callers.
    pub fn with_pool(base_url: &str, idle_connections: usize) -> Result<Client, ClientError> {
        Self::connect(base_url, idle_connections, &Credentials::default())
    }

    /// A client that sends `credentials`' token and trusts its CA.
    pub fn connect(
        base_url: &str,
        idle_connections: usize,
        credentials: &Credentials,
    ) -> Result<Client, ClientError> {
        let parsed = url::Url::parse(base_url).map_err(|_| ClientError::BadUrl(base_url.into()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(ClientError::BadUrl(base_url.into()));
        }
        let mut builder = reqwest::Client::builder()
            .pool_max_idle_per_host(idle_connections)
            .timeout(Duration::from_secs(60));
        if let Some(token) = &credentials.token {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| {
                    ClientError::BadCredentials("the token must be visible ASCII".into())
                })?;
            value.set_sensitive(true);
            let mut headers = reqwest::header::HeaderMap::new();
            headers.insert(reqwest::header::AUTHORIZATION, value);
            builder = builder.default_headers(headers);
        }
        if let Some(pem) = &credentials.ca_cert_pem {
            let roots = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| ClientError::BadCredentials(format!("the CA certificate: {e}")))?;
            if roots.is_empty() {
                return Err(ClientError::BadCredentials(
                    "the CA file holds no PEM certificate".into(),
                ));
            }
            for root in roots {
                builder = builder.add_root_certificate(root);
            }
        }
        let http = builder.build().map_err(|source| ClientError::Http {
            url: base_url.into(),
            source,
        })?;
        Ok(Client {
            http,
            base: base_url.trim_end_matches('/').to_owned(),
        })
    }

    pub async fn submit(&self, spec: &TaskSpec) -> Result<SubmitAnswer, ClientError> {
        let url = format!("{}/v1/tasks", self.base);
        let response = self.send(&url, self.http.post(&url).json(spec)).await?;
        let replayed = response.status() == reqwest::StatusCode::OK;
        let task = Self::decode(&url, response).await?;
        Ok(SubmitAnswer { task, replayed })
    }

    pub async fn task(&self, id: &str) -> Result<Value, ClientError> {
        self.get_json(&format!("/v1/tasks/{id}"), &[]).await
    }

    pub async fn list(&self, query: &[(&str, String)]) -> Result<Value, ClientError> {
        self.get_json("/v1/tasks", query).await
    }

    /// A page of the global event log after `after_seq`.
    pub async fn log(&self, after_seq: u64, limit: usize) -> Result<Value, ClientError> {
        let query = [
            ("after", after_seq.to_string()),
            ("limit", limit.to_string()),
        ];
        self.get_json("/v1/events", &query).await
    }

    pub async fn events(&self, id: &str) -> Result<Value, ClientError> {
        self.get_json(&format!("/v1/tasks/{id}/events"), &[]).await
    }

    pub async fn cancel(&self, id: &str) -> Result<Value, ClientError> {
        let url = format!("{}/v1/tasks/{id}/cancel", self.base);
        let response = self.send(&url, self.http.post(&url)).await?;
        Self::decode(&url, response).await
    }

    /// Uploads a policy component of `kind` (priority, aging, retry, split, merge) with an
    /// optional config (`name=value` lines).
    pub async fn upload_policy(
        &self,
        kind: &str,
        component: Vec<u8>,
        config: Option<&str>,
        signature: Option<&str>,
        grants: (Option<u64>, Option<u64>),
    ) -> Result<Value, ClientError> {
        let url = format!("{}/v1/policies/{kind}", self.base);
        let mut request = self
            .http
            .put(&url)
            .timeout(POLICY_UPLOAD_TIMEOUT)
            .header(reqwest::header::CONTENT_TYPE, "application/wasm")
            .body(component);
        if let Some(signature) = signature {
            request = request.header(sluice_wire::SIGNATURE_HEADER, signature.trim());
        }
        if let Some(config) = config {
            request = request.query(&[("config", config)]);
        }
        let (memory_limit_bytes, call_fuel) = grants;
        if let Some(bytes) = memory_limit_bytes {
            request = request.query(&[("memory_limit_bytes", bytes)]);
        }
        if let Some(fuel) = call_fuel {
            request = request.query(&[("call_fuel", fuel)]);
        }
        let response = self.send(&url, request).await?;
        Self::decode(&url, response).await
    }

    /// Stores data blob `name` beside `version` of `kind` (before it is activated).
    pub async fn put_policy_data(
        &self,
        kind: &str,
        version: u64,
        name: &str,
        bytes: Vec<u8>,
        signature: Option<&str>,
    ) -> Result<Value, ClientError> {
        let url = format!("{}/v1/policies/{kind}/{version}/data/{name}", self.base);
        let mut request = self
            .http
            .put(&url)
            .timeout(POLICY_UPLOAD_TIMEOUT)
            .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
            .body(bytes);
        if let Some(signature) = signature {
            request = request.header(sluice_wire::SIGNATURE_HEADER, signature.trim());
        }
        let response = self.send(&url, request).await?;
        Self::decode(&url, response).await
    }

    pub async fn activate_policy(&self, kind: &str, version: u32) -> Result<Value, ClientError> {
        let url = format!("{}/v1/policies/{kind}/activate", self.base);
        let request = self
            .http
            .post(&url)
            .json(&serde_json::json!({ "version": version }));
        let response = self.send(&url, request).await?;
        Self::decode(&url, response).await
    }

    pub async fn rollback_policy(&self, kind: &str) -> Result<Value, ClientError> {
        let url = format!("{}/v1/policies/{kind}/rollback", self.base);
        let response = self.send(&url, self.http.post(&url)).await?;
        Self::decode(&url, response).await
    }

    /// Every kind with its active version, or one kind in full.
    pub async fn policies(&self, kind: Option<&str>) -> Result<Value, ClientError> {
        match kind {
            Some(kind) => self.get_json(&format!("/v1/policies/{kind}"), &[]).await,
            None => self.get_json("/v1/policies", &[]).await,
        }
    }

    /// Starts an experiment (`POST /v1/experiments`).
    pub async fn start_experiment(&self, spec: &Value) -> Result<Value, ClientError> {
        self.post_json("/v1/experiments", spec).await
    }

    /// Every experiment, or one's report.
    pub async fn experiments(&self, id: Option<u32>) -> Result<Value, ClientError> {
        match id {
            Some(id) => self.get_json(&format!("/v1/experiments/{id}"), &[]).await,
            None => self.get_json("/v1/experiments", &[]).await,
        }
    }

    pub async fn stop_experiment(&self, id: u32) -> Result<Value, ClientError> {
        self.post_json(
            &format!("/v1/experiments/{id}/stop"),
            &serde_json::json!({}),
        )
        .await
    }

    /// Starts a guarded rollout (`POST /v1/rollouts`).
    pub async fn start_rollout(&self, spec: &Value) -> Result<Value, ClientError> {
        self.post_json("/v1/rollouts", spec).await
    }

    /// Every rollout, or one.
    pub async fn rollouts(&self, id: Option<u32>) -> Result<Value, ClientError> {
        match id {
            Some(id) => self.get_json(&format!("/v1/rollouts/{id}"), &[]).await,
            None => self.get_json("/v1/rollouts", &[]).await,
        }
    }

    pub async fn stop_rollout(&self, id: u32) -> Result<Value, ClientError> {
        self.post_json(&format!("/v1/rollouts/{id}/stop"), &serde_json::json!({}))
            .await
    }

    pub async fn promote_experiment(&self, id: u32, variant: &str) -> Result<Value, ClientError> {
        let body = serde_json::json!({ "variant": variant });
        self.post_json(&format!("/v1/experiments/{id}/promote"), &body)
            .await
    }

    /// Registers or refreshes worker `id`.
    pub async fn worker_heartbeat(
        &self,
        id: &str,
        heartbeat: &Heartbeat,
    ) -> Result<Value, ClientError> {
        self.post_json(&format!("/v1/workers/{id}/heartbeat"), heartbeat)
            .await
    }

    /// Claims up to `max` tasks for worker `id`, waiting up to `wait_ms` for work. `claim_id`
    /// names the claim: after an error, sending the same one again returns what it granted.
    pub async fn claim(
        &self,
        id: &str,
        max: usize,
        wait_ms: u64,
        claim_id: Option<&str>,
    ) -> Result<ClaimResponse, ClientError> {
        self.claim_batch(id, max, wait_ms, claim_id, None).await
    }

    /// `claim`, for one GPU batch when `batch` is given: up to `batch.max_size` tasks of one
    /// kind, model and batch key, on one GPU.
    pub async fn claim_batch(
        &self,
        id: &str,
        max: usize,
        wait_ms: u64,
        claim_id: Option<&str>,
        batch: Option<&BatchRequest>,
    ) -> Result<ClaimResponse, ClientError> {
        let mut body = serde_json::json!({ "max": max, "wait_ms": wait_ms });
        if let Some(claim_id) = claim_id {
            body["claim_id"] = Value::String(claim_id.to_owned());
        }
        if let Some(batch) = batch {
            body["batch"] = serde_json::json!({
                "max_size": batch.max_size,
                "max_wait_ms": batch.max_wait_ms,
                "models": batch.models,
            });
        }
        let url = format!("{}/v1/workers/{id}/claim", self.base);
        // A long poll may outlast the client's usual timeout.
        let timeout = Duration::from_millis(wait_ms) + Duration::from_secs(30);
        let request = self.http.post(&url).json(&body).timeout(timeout);
        let response = self.send(&url, request).await?;
        Self::decode(&url, response).await
    }

    /// Reports on the attempt `lease_token` names: `report` is `start`, `heartbeat`,
    /// `complete` or `fail`, with the extra fields of `body` (`result`; `class`, `message`).
    pub async fn report(
        &self,
        task: TaskId,
        lease_token: &str,
        report: &str,
        mut body: serde_json::Map<String, Value>,
    ) -> Result<TaskView, ClientError> {
        body.insert("lease_token".into(), Value::String(lease_token.to_owned()));
        self.post_json(&format!("/v1/tasks/{task}/{report}"), &body)
            .await
    }

    /// Several reports in one request (`POST /v1/reports`): each item is `{report, task,
    /// lease_token, ...}`; the answer holds one result per item, in order.
    /// Several reports in one request (`POST /v1/reports`): `reports` serializes as the list of
    /// report objects; the answer is read as `T` (`serde_json::Value` for all of it).
    pub async fn report_batch<T: serde::de::DeserializeOwned>(
        &self,
        reports: &impl serde::Serialize,
    ) -> Result<T, ClientError> {
        #[derive(serde::Serialize)]
        struct Batch<'a, R> {
            reports: &'a R,
        }
        self.post_json("/v1/reports", &Batch { reports }).await
    }

    pub async fn workers(&self) -> Result<Value, ClientError> {
        self.get_json("/v1/workers", &[]).await
    }

    /// Every vector collection known, or one, with the shards that have a live worker.
    pub async fn collections(&self, name: Option<&str>) -> Result<Value, ClientError> {
        match name {
            Some(name) => self.get_json(&format!("/v1/collections/{name}"), &[]).await,
            None => self.get_json("/v1/collections", &[]).await,
        }
    }

    /// Declares a vector collection (admin): `{"dim": .., "metric": .., "shards": ..}`.
    pub async fn declare_collection(&self, name: &str, body: &Value) -> Result<Value, ClientError> {
        self.put_json(&format!("/v1/collections/{name}"), body)
            .await
    }

    /// The scheduler's counts: tasks by state, queued tasks by bucket.
    pub async fn stats(&self) -> Result<Value, ClientError> {
        self.get_json("/v1/stats", &[]).await
    }

    /// Issues a token (admin): the answer holds its text, shown this once.
    pub async fn issue_token(
        &self,
        request: &sluice_wire::TokenRequest,
    ) -> Result<Value, ClientError> {
        self.post_json("/v1/tokens", request).await
    }

    pub async fn tokens(&self) -> Result<Value, ClientError> {
        self.get_json("/v1/tokens", &[]).await
    }

    pub async fn revoke_token(&self, id: &str) -> Result<Value, ClientError> {
        let url = format!("{}/v1/tokens/{id}", self.base);
        let response = self.send(&url, self.http.delete(&url)).await?;
        Self::decode(&url, response).await
    }

    /// The audit log of admin actions after `after_seq`.
    pub async fn audit(&self, after_seq: u64) -> Result<Value, ClientError> {
        self.get_json("/v1/audit", &[("after", after_seq.to_string())])
            .await
    }

    /// The worker log (breaker changes) after `after_seq`.
    pub async fn worker_events(&self, after_seq: u64) -> Result<Value, ClientError> {
        self.get_json("/v1/worker-events", &[("after", after_seq.to_string())])
            .await
    }

    async fn post_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<T, ClientError> {
        let url = format!("{}{path}", self.base);
        let response = self.send(&url, self.http.post(&url).json(body)).await?;
        Self::decode(&url, response).await
    }

    async fn put_json(
        &self,
        path: &str,
        body: &impl serde::Serialize,
    ) -> Result<Value, ClientError> {
        let url = format!("{}{path}", self.base);
        let response = self.send(&url, self.http.put(&url).json(body)).await?;
        Self::decode(&url, response).await
    }

    async fn get_json(&self, path: &str, query: &[(&str, String)]) -> Result<Value, ClientError> {
        let url = format!("{}{path}", self.base);
        let response = self.send(&url, self.http.get(&url).query(query)).await?;
        Self::decode(&url, response).await
    }

    async fn send(
        &self,
        url: &str,
        request: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ClientError> {
        request.send().await.map_err(|source| ClientError::Http {
            url: url.to_owned(),
            source,
        })
    }

    async fn decode<T: serde::de::DeserializeOwned>(
        url: &str,
        response: reqwest::Response,
    ) -> Result<T, ClientError> {
        let status = response.status().as_u16();
        let bytes = response.bytes().await.map_err(|source| ClientError::Http {
            url: url.to_owned(),
            source,
        })?;
        if (200..300).contains(&status) {
            if let Ok(value) = serde_json::from_slice(&bytes) {
                return Ok(value);
            }
        } else if let Ok(problem) = serde_json::from_slice::<ProblemBody>(&bytes) {
            return Err(ClientError::Problem {
                status,
                kind: problem.kind,
                title: problem.title,
                detail: problem.detail,
            });
        }
        Err(ClientError::Unexpected {
            url: url.to_owned(),
            status,
            body: String::from_utf8_lossy(&bytes).chars().take(512).collect(),
        })
    }
}
