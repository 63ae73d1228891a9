//! The end-to-end harness: builds the real `sluice` binary once, starts it on port 0 with a
//! temporary data directory, and stops it with SIGTERM or SIGKILL.

pub mod disk;
mod receiver;

pub use receiver::callback_receiver;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

pub use serde_json::{Value, json};

/// The `sluice` binary of this build profile, built first if need be (cargo does not build a
/// bin of another package for this crate's tests).
pub fn sluice_binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let test_exe = std::env::current_exe().expect("test executable path");
        // target/<profile>/deps/<test> → target/<profile>
        let profile_dir = test_exe
            .parent()
            .and_then(Path::parent)
            .expect("target/<profile> above the test executable");
        // The same packages and targets as `cargo test --workspace`, so cargo resolves the
        // same features and reuses what that run compiled: only the binary is linked. With
        // `-p sluice` alone the features differ and half the dependency tree is rebuilt
        // (6 minutes against 22 s from a clean clone on the 2-core VM).
        let mut build = Command::new(env!("CARGO"));
        build.args(["build", "--quiet", "--workspace", "--bins", "--tests"]);
        if profile_dir
            .file_name()
            .is_some_and(|name| name == "release")
        {
            build.arg("--release");
        }
        let status = build.status().expect("run cargo build");
        assert!(status.success(), "cargo build of the sluice binary failed");
        profile_dir.join("sluice")
    })
}

/// A running `sluice serve`, killed if the test ends without stopping it.
pub struct Server {
    child: Child,
    pub url: String,
    /// The first line it printed: `listening on URL (auth: ...)`.
    pub announce: String,
}

impl Server {
    /// Starts `sluice serve` on `data_dir` and waits for its `listening on` line.
    pub fn start(data_dir: &Path) -> Server {
        Self::start_with(data_dir, &[])
    }

    pub fn start_with(data_dir: &Path, extra_args: &[&str]) -> Server {
        Self::launch(data_dir, extra_args, &[("SLUICE_LOG", "warn")], None)
    }

    /// Starts `sluice serve` with `env` set and, when `log_file` is given, its stderr (the
    /// log) written there.
    pub fn launch(
        data_dir: &Path,
        extra_args: &[&str],
        env: &[(&str, &str)],
        log_file: Option<&Path>,
    ) -> Server {
        let stderr = match log_file {
            Some(path) => Stdio::from(std::fs::File::create(path).expect("create the log file")),
            None => Stdio::inherit(),
        };
        let mut child = Command::new(sluice_binary())
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(extra_args)
            .env("SLUICE_LOG", "warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .expect("start sluice serve");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .expect("read the announce line");
        let url = line
            .trim()
            .strip_prefix("listening on ")
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("unexpected first line from sluice serve: {line:?}"))
            .to_owned();
        Server {
            child,
            url,
            announce: line.trim().to_owned(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn endpoint(&self, path: &str) -> String {
        format!("{}{path}", self.url)
    }

    /// SIGKILL: no chance to flush or clean up.
    pub fn kill9(mut self) {
        self.child.kill().expect("SIGKILL the server");
        self.child.wait().expect("reap the server");
    }

    /// SIGTERM, then waits for the process to exit.
    pub fn terminate(self) -> ExitStatus {
        self.send_sigterm();
        self.wait()
    }

    /// SIGTERM without waiting: the server drains while the test watches.
    pub fn send_sigterm(&self) {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        let sent = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(sent, 0, "send SIGTERM");
    }

    /// Waits for the process to exit until `deadline`; None if it is still running then.
    pub fn wait_until(mut self, deadline: std::time::Instant) -> Option<ExitStatus> {
        loop {
            if let Some(status) = self.child.try_wait().expect("poll the server") {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the process to exit.
    pub fn wait(mut self) -> ExitStatus {
        self.child.wait().expect("wait for the server")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The URL of the PostgreSQL server the tests may create databases on (`SLUICE_TEST_POSTGRES`),
/// or `None` with a line saying the test is skipped. With `SLUICE_REQUIRE_POSTGRES=1` (CI) a
/// missing one fails the test.
pub fn postgres_server() -> Option<String> {
    let url = std::env::var("SLUICE_TEST_POSTGRES")
        .ok()
        .filter(|url| !url.is_empty());
    if url.is_none() {
        assert!(
            std::env::var("SLUICE_REQUIRE_POSTGRES").as_deref() != Ok("1"),
            "SLUICE_REQUIRE_POSTGRES=1 but SLUICE_TEST_POSTGRES is not set"
        );
        eprintln!(
            "skipped on PostgreSQL: set SLUICE_TEST_POSTGRES to a postgres:// URL of a server where tests may create databases"
        );
    }
    url
}

/// The backend a test's servers keep their state in. Tests of the engine's semantics run on
/// each (`on_each_store!`); the PostgreSQL ones need `SLUICE_TEST_POSTGRES`, a `postgres://`
/// URL of a server on which the tests may create databases (CI starts one).
pub enum TestStore {
    Sled,
    /// A database made for this test, dropped with it.
    Postgres(String),
}

impl TestStore {
    /// A fresh PostgreSQL database, or `None` (with a line saying the test is skipped) when no
    /// server is configured. With `SLUICE_REQUIRE_POSTGRES=1` (CI) a missing one fails.
    pub fn postgres() -> Option<TestStore> {
        let url = postgres_server()?;
        let database = sluice_store_postgres::scratch_database(&url, "sluice_test")
            .unwrap_or_else(|error| panic!("cannot make a test database on {url}: {error}"));
        Some(TestStore::Postgres(database))
    }

    /// The flags that point `sluice serve` at this store (beside its data directory, which
    /// it still uses for nothing else).
    pub fn args(&self) -> Vec<String> {
        match self {
            TestStore::Sled => Vec::new(),
            TestStore::Postgres(url) => vec!["--store".into(), url.clone()],
        }
    }

    pub fn start(&self, data_dir: &Path) -> Server {
        self.start_with(data_dir, &[])
    }

    pub fn start_with(&self, data_dir: &Path, extra_args: &[&str]) -> Server {
        self.launch(data_dir, extra_args, &[("SLUICE_LOG", "warn")], None)
    }

    pub fn launch(
        &self,
        data_dir: &Path,
        extra_args: &[&str],
        env: &[(&str, &str)],
        log_file: Option<&Path>,
    ) -> Server {
        let store_args = self.args();
        let mut args: Vec<&str> = store_args.iter().map(String::as_str).collect();
        args.extend_from_slice(extra_args);
        Server::launch(data_dir, &args, env, log_file)
    }
}

impl Drop for TestStore {
    fn drop(&mut self) {
        if let TestStore::Postgres(url) = self
            && let Err(error) = sluice_store_postgres::drop_scratch_database(url)
        {
            eprintln!("cannot drop the test database {url}: {error}");
        }
    }
}

/// Runs `scenario(store)` as two tests, `scenario::sled` and `scenario::postgres` (the second
/// skipped with a line when no PostgreSQL is configured).
#[macro_export]
macro_rules! on_each_store {
    ($scenario:ident) => {
        mod $scenario {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn sled() {
                super::$scenario($crate::TestStore::Sled).await
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn postgres() {
                if let Some(store) = $crate::TestStore::postgres() {
                    super::$scenario(store).await
                }
            }
        }
    };
}

/// Writes `data` as a C-order `.npy` of little-endian f32 with `dim` columns.
pub fn write_npy(path: &Path, dim: usize, data: &[f32]) {
    let rows = data.len() / dim;
    let mut header =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {dim}), }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for x in data {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    std::fs::write(path, bytes).expect("write the .npy");
}

/// PUTs `bytes` as `application/octet-stream` to `url`.
pub async fn put_octets(client: &reqwest::Client, url: &str, bytes: Vec<u8>) -> Answer {
    let request = client
        .put(url)
        .header("content-type", "application/octet-stream")
        .body(bytes);
    answer(request.send().await.expect("PUT")).await
}

/// A client that sends `Authorization: Bearer TOKEN` on every request.
pub fn http_as(token: &str) -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    let value = format!("Bearer {token}").parse().expect("a token header");
    headers.insert(reqwest::header::AUTHORIZATION, value);
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(256)
        .default_headers(headers)
        .build()
        .expect("HTTP client")
}

/// Issues a token as `admin` (a client with an admin token); answers its text and id.
pub async fn issue_token(
    admin: &reqwest::Client,
    server: &Server,
    request: &Value,
) -> (String, String) {
    let issued = post_json(admin, &server.endpoint("/v1/tokens"), request).await;
    assert_eq!(issued.status, 201, "{:?}", issued.body);
    (
        issued.body["token"].as_str().expect("token").to_owned(),
        issued.body["id"].as_str().expect("id").to_owned(),
    )
}

pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .pool_max_idle_per_host(256)
        .build()
        .expect("HTTP client")
}

/// A JSON answer: status, the `Idempotent-Replay` header, content type, and body.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub replayed: bool,
    pub content_type: String,
    pub body: Value,
}

pub async fn answer(response: reqwest::Response) -> Answer {
    let status = response.status().as_u16();
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned()
    };
    let replayed = header("idempotent-replay") == "true";
    let content_type = header("content-type");
    let bytes = response.bytes().await.expect("read the body");
    let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Answer {
        status,
        replayed,
        content_type,
        body,
    }
}

pub async fn post_json(client: &reqwest::Client, url: &str, body: &Value) -> Answer {
    let response = client.post(url).json(body).send().await.expect("POST");
    answer(response).await
}

pub async fn get_json(client: &reqwest::Client, url: &str) -> Answer {
    answer(client.get(url).send().await.expect("GET")).await
}

/// Registers `worker` with one 40 GB GPU and `max_concurrency`; asserts it is healthy.
pub async fn register_worker(
    client: &reqwest::Client,
    server: &Server,
    worker: &str,
    max_concurrency: u32,
) {
    let answer = post_json(
        client,
        &server.endpoint(&format!("/v1/workers/{worker}/heartbeat")),
        &json!({"gpus": [{"model": "A100", "memory_mb": 40000}], "max_concurrency": max_concurrency}),
    )
    .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(answer.body["healthy"], true, "{:?}", answer.body);
}

/// Claims exactly one task for `worker` (waiting up to 5 s for it): the lease.
pub async fn claim_lease(client: &reqwest::Client, server: &Server, worker: &str) -> Value {
    let answer = post_json(
        client,
        &server.endpoint(&format!("/v1/workers/{worker}/claim")),
        &json!({"max": 1, "wait_ms": 5000}),
    )
    .await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let leases = answer.body["leases"].as_array().expect("leases");
    assert_eq!(leases.len(), 1, "{:?}", answer.body);
    leases[0].clone()
}

/// A worker's report on task `id`: `start`, `heartbeat`, `complete` or `fail`.
pub async fn report(
    client: &reqwest::Client,
    server: &Server,
    id: &str,
    what: &str,
    body: Value,
) -> Answer {
    post_json(
        client,
        &server.endpoint(&format!("/v1/tasks/{id}/{what}")),
        &body,
    )
    .await
}

/// Every task in the store, following `next_after` page by page.
pub async fn all_tasks(client: &reqwest::Client, server: &Server) -> Vec<Value> {
    let mut tasks = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let mut url = server.endpoint("/v1/tasks?limit=1000");
        if let Some(after) = &after {
            url.push_str(&format!("&after={after}"));
        }
        let page = get_json(client, &url).await;
        assert_eq!(page.status, 200, "{:?}", page.body);
        tasks.extend(
            page.body["tasks"]
                .as_array()
                .expect("tasks array")
                .iter()
                .cloned(),
        );
        match page.body["next_after"].as_str() {
            Some(next) => after = Some(next.to_owned()),
            None => return tasks,
        }
    }
}

/// Every event `seq` in the global log, oldest first, page by page.
pub async fn event_seqs(client: &reqwest::Client, server: &Server) -> Vec<u64> {
    let mut seqs = Vec::new();
    loop {
        let after = seqs.last().copied().unwrap_or(0);
        let url = server.endpoint(&format!("/v1/events?after={after}&limit=1000"));
        let page = get_json(client, &url).await;
        assert_eq!(page.status, 200, "{:?}", page.body);
        let events = page.body["events"].as_array().expect("events array");
        if events.is_empty() {
            return seqs;
        }
        seqs.extend(events.iter().map(|e| e["seq"].as_u64().expect("seq")));
    }
}

/// Asserts the global event log runs 1, 2, 3, … without a gap.
pub async fn assert_gap_free_log(client: &reqwest::Client, server: &Server) -> usize {
    let seqs = event_seqs(client, server).await;
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "the event log has a gap");
    seqs.len()
}

/// Asserts an error answer is RFC 9457 problem+json of the given status and type.
pub fn assert_problem(answer: &Answer, status: u16, problem_type: &str) {
    assert_eq!(answer.status, status, "{:?}", answer.body);
    assert_eq!(
        answer.content_type, "application/problem+json",
        "{answer:?}"
    );
    assert_eq!(
        answer.body["type"],
        format!("urn:sluice:problem:{problem_type}"),
        "{answer:?}"
    );
    assert_eq!(answer.body["status"], status);
    assert!(answer.body["title"].is_string() && answer.body["detail"].is_string());
}

/// A policy component built from `policies/`: `package` with `feature` (the hostile ones),
/// for wasm32-wasip2, in a target directory of its own that later runs reuse. Builds take
/// turns, and each result is read before the next build can overwrite it.
pub fn policy_component(package: &str, feature: Option<&str>) -> Vec<u8> {
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = BUILDING.lock().unwrap_or_else(|p| p.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target_dir = root.join("target/policies-tests");
    let mut build = Command::new(env!("CARGO"));
    build
        .args(["build", "--release", "--quiet", "--target", "wasm32-wasip2"])
        .args(["-p", package, "--manifest-path"])
        .arg(root.join("policies/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    if let Some(feature) = feature {
        build.args(["--features", feature]);
    }
    let status = build.status().expect("run cargo to build a policy");
    assert!(
        status.success(),
        "building the policy {package} {feature:?} failed"
    );
    let file = format!("wasm32-wasip2/release/{}.wasm", package.replace('-', "_"));
    std::fs::read(target_dir.join(file)).expect("the built component")
}

/// Builds the policy project in `project` (as `sluice policy new` writes one) for
/// wasm32-wasip2, in the same target directory as `policy_component`, and reads its component.
pub fn build_policy_project(project: &Path, crate_name: &str) -> Vec<u8> {
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = BUILDING.lock().unwrap_or_else(|p| p.into_inner());
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let target_dir = root.join("target/policies-tests");
    let status = Command::new(env!("CARGO"))
        .args(["build", "--release", "--quiet", "--target", "wasm32-wasip2"])
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(project)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .expect("run cargo to build a policy project");
    assert!(status.success(), "building {} failed", project.display());
    let file = format!(
        "wasm32-wasip2/release/{}.wasm",
        crate_name.replace('-', "_")
    );
    std::fs::read(target_dir.join(file)).expect("the built component")
}

/// componentize-py (PyPI), which builds the Python policies: `SLUICE_COMPONENTIZE_PY` (`.ci/run`
/// sets it to where pip put it) or `componentize-py` on PATH. `None` when there is none, and
/// the caller skips, unless `SLUICE_REQUIRE_COMPONENTIZE_PY=1` (set by `.ci/run`) makes that a
/// failure.
pub fn componentize_py() -> Option<PathBuf> {
    let program = PathBuf::from(
        std::env::var("SLUICE_COMPONENTIZE_PY").unwrap_or_else(|_| "componentize-py".into()),
    );
    let found = Command::new(&program)
        .arg("--version")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let required = std::env::var("SLUICE_REQUIRE_COMPONENTIZE_PY").is_ok_and(|v| v == "1");
    assert!(
        found || !required,
        "SLUICE_REQUIRE_COMPONENTIZE_PY=1 but {} does not run: pip install componentize-py",
        program.display()
    );
    found.then_some(program)
}

/// A `PATH` on which `componentize-js` (npm), which builds the JavaScript policies, runs:
/// `SLUICE_COMPONENTIZE_JS` (`.ci/run` sets it to the `node_modules/.bin` it installed) put
/// first, or the `PATH` as it is. `None` when it does not run there, and the caller skips,
/// unless `SLUICE_REQUIRE_COMPONENTIZE_JS=1` (set by `.ci/run`) makes that a failure.
pub fn componentize_js_path() -> Option<String> {
    let inherited = std::env::var("PATH").unwrap_or_default();
    let path = match std::env::var("SLUICE_COMPONENTIZE_JS") {
        Ok(folder) => format!("{folder}:{inherited}"),
        Err(_) => inherited,
    };
    let found = Command::new("componentize-js")
        .arg("--version")
        .env("PATH", &path)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let required = std::env::var("SLUICE_REQUIRE_COMPONENTIZE_JS").is_ok_and(|v| v == "1");
    assert!(
        found || !required,
        "SLUICE_REQUIRE_COMPONENTIZE_JS=1 but componentize-js does not run: npm install @bytecodealliance/componentize-js"
    );
    found.then_some(path)
}

/// Builds the Python policy whose `app.py` is in the first of `python_path` as a component of
/// `world`, against the repository's WIT, and reads it.
pub fn build_python_policy(
    componentize_py: &Path,
    world: &str,
    python_path: &[&Path],
    out: &Path,
) -> Vec<u8> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut command = Command::new(componentize_py);
    command
        // Importing the policy to snapshot it would leave __pycache__ in the source tree.
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .arg("-d")
        .arg(root.join("wit"))
        .args(["-w", world, "componentize", "app", "-o"])
        .arg(out);
    for path in python_path {
        command.arg("-p").arg(path);
    }
    let built = command.output().expect("run componentize-py");
    assert!(
        built.status.success(),
        "componentize-py failed for {world}: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    std::fs::read(out).expect("the built component")
}

/// PUTs `bytes` as a component of `kind`, with `config` (name=value lines) if given.
pub async fn put_policy(
    client: &reqwest::Client,
    server: &Server,
    kind: &str,
    bytes: Vec<u8>,
    config: Option<&str>,
) -> Answer {
    let mut request = client
        .put(server.endpoint(&format!("/v1/policies/{kind}")))
        .header("content-type", "application/wasm")
        .body(bytes);
    if let Some(config) = config {
        request = request.query(&[("config", config)]);
    }
    answer(request.send().await.expect("PUT")).await
}

/// `sluice policy upload` of `file` as `kind` with `settings` (name=value), then `sluice policy
/// activate` of the version it made: that version.
pub fn upload_and_activate(server: &Server, kind: &str, file: &Path, settings: &[&str]) -> u64 {
    let mut args = vec!["policy", "upload", "--server", &server.url, kind];
    let path = file.to_str().unwrap();
    args.push(path);
    for setting in settings {
        args.extend(["--config", setting]);
    }
    let uploaded: Value = serde_json::from_str(&succeeded(run_sluice(&args, &[]))).unwrap();
    let version = uploaded["version"].as_u64().unwrap();
    let activate = [
        "policy",
        "activate",
        "--server",
        &server.url,
        kind,
        &version.to_string(),
    ];
    succeeded(run_sluice(&activate, &[]));
    version
}

/// Runs the `sluice` command with `args` and `env` (logs at warn), waiting for it.
pub fn run_sluice(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    Command::new(sluice_binary())
        .args(args)
        .env("SLUICE_LOG", "warn")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run sluice")
}

/// The stdout of a command that must have succeeded (its stderr in the failure otherwise).
pub fn succeeded(output: std::process::Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("UTF-8 output")
}

/// A running `sluice worker`, killed if the test ends without stopping it.
pub struct Worker {
    child: Child,
    pub id: String,
}

impl Worker {
    /// Starts `sluice worker --server <server> --id <id>` with `extra_args`.
    pub fn start(server: &Server, id: &str, extra_args: &[&str]) -> Worker {
        Self::start_with_env(server, id, extra_args, &[])
    }

    /// `start`, with `env` set (`SLUICE_TOKEN`, say).
    pub fn start_with_env(
        server: &Server,
        id: &str,
        extra_args: &[&str],
        env: &[(&str, &str)],
    ) -> Worker {
        let child = Command::new(sluice_binary())
            .args(["worker", "--server", &server.url, "--id", id])
            .args(extra_args)
            .env("SLUICE_LOG", "warn")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start sluice worker");
        Worker {
            child,
            id: id.to_owned(),
        }
    }

    pub fn kill9(mut self) {
        self.child.kill().expect("SIGKILL the worker");
        self.child.wait().expect("reap the worker");
    }

    /// SIGTERM; waits for the worker to finish what it holds; its summary line.
    pub fn terminate(mut self) -> String {
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        let sent = unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(sent, 0, "send SIGTERM");
        let mut out = String::new();
        if let Some(stdout) = self.child.stdout.take() {
            let _ = BufReader::new(stdout).read_line(&mut out);
        }
        let status = self.child.wait().expect("wait for the worker");
        assert!(status.success(), "worker {} exited {status}", self.id);
        out
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Polls `check` every 20 ms until it answers `Some`, failing the test after `limit`.
pub async fn wait_for<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let started = std::time::Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(started.elapsed() < limit, "gave up waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until `count` shards of `collection` have a live worker, as `GET /v1/collections/NAME`
/// shows it (a search split before would leave a shard out); its view.
pub async fn live_shards(
    client: &reqwest::Client,
    server: &Server,
    collection: &str,
    count: u64,
) -> Value {
    let url = server.endpoint(&format!("/v1/collections/{collection}"));
    wait_for(
        &format!("{count} live shards of {collection}"),
        Duration::from_secs(60),
        || async {
            let answer = get_json(client, &url).await;
            (answer.status == 200 && answer.body["live_shards"] == count).then_some(answer.body)
        },
    )
    .await
}

/// The scheduler's counts (`GET /v1/stats`): tasks in `state`.
pub async fn count_in(client: &reqwest::Client, server: &Server, state: &str) -> u64 {
    let stats = get_json(client, &server.endpoint("/v1/stats")).await;
    stats.body["tasks_by_state"][state].as_u64().unwrap_or(0)
}
