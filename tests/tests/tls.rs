//! https end to end, with a CA and a server certificate made in the test (rcgen): a plain
//! https client, the CLI and the reference worker all reach the server when they trust the
//! CA, and fail to when they do not; SIGHUP swaps in a new certificate without a restart.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
use sluice_tests::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const ROOT: &str = "root-token-for-the-tls-test";

/// A new CA, and a certificate for 127.0.0.1 it signed: writes `ca.pem`, `cert.pem` and
/// `key.pem` under `dir` (replacing them), and answers the CA file's path.
fn make_certificates(dir: &Path, name: &str) -> PathBuf {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, format!("Sluice test CA {name}"));
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let mut leaf_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf_params.subject_alt_names = vec![SanType::IpAddress("127.0.0.1".parse().unwrap())];
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key).unwrap();
    let ca_file = dir.join(format!("ca-{name}.pem"));
    std::fs::write(&ca_file, ca.pem()).unwrap();
    std::fs::write(dir.join("cert.pem"), leaf.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), leaf_key.serialize_pem()).unwrap();
    ca_file
}

fn trusting(ca_file: &Path) -> reqwest::Client {
    let pem = std::fs::read(ca_file).unwrap();
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("authorization", format!("Bearer {ROOT}").parse().unwrap());
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .default_headers(headers)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_trust_the_ca_reach_the_server_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let ca_file = make_certificates(dir.path(), "first");
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let server = Server::launch(
        &dir.path().join("data"),
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
        &[("SLUICE_ADMIN_TOKEN", ROOT)],
        None,
    );
    assert!(
        server.url.starts_with("https://127.0.0.1:"),
        "{}",
        server.url
    );

    // A plain https client: trusted with the CA, refused without it.
    let client = trusting(&ca_file);
    let health = client
        .get(server.endpoint("/healthz"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let untrusting = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    assert!(
        untrusting
            .get(server.endpoint("/healthz"))
            .send()
            .await
            .is_err()
    );
    // Plain http to the https port gets no answer.
    let plain = server.url.replace("https://", "http://");
    assert!(
        untrusting
            .get(format!("{plain}/healthz"))
            .send()
            .await
            .is_err()
    );

    // The CLI, with --ca-cert and a token; without the CA it fails with a message.
    let submit = |extra: &[&str]| {
        Command::new(sluice_binary())
            .args(["submit", "--server", &server.url, "--kind", "oct.scan"])
            .args(extra)
            .env("SLUICE_TOKEN", ROOT)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let refused = submit(&[]);
    assert!(!refused.status.success());
    assert!(!refused.stderr.is_empty());
    let submitted = submit(&["--ca-cert", ca_file.to_str().unwrap()]);
    assert!(
        submitted.status.success(),
        "{}",
        String::from_utf8_lossy(&submitted.stderr)
    );
    let task: Value = serde_json::from_slice(&submitted.stdout).unwrap();
    let id = task["id"].as_str().unwrap().to_owned();

    // The reference worker, with a worker token, runs it to completion over https.
    let issued = post_json(
        &client,
        &server.endpoint("/v1/tokens"),
        &json!({"role": "worker", "worker": "gpu-tls"}),
    )
    .await;
    assert_eq!(issued.status, 201, "{:?}", issued.body);
    let worker_token = issued.body["token"].as_str().unwrap().to_owned();
    let _worker = Worker::start_with_env(
        &server,
        "gpu-tls",
        &["--ca-cert", ca_file.to_str().unwrap(), "--exec-ms", "10"],
        &[("SLUICE_TOKEN", &worker_token)],
    );
    let url = server.endpoint(&format!("/v1/tasks/{id}"));
    wait_for(
        "the task to complete over https",
        Duration::from_secs(30),
        || {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let task = get_json(&client, &url).await;
                (task.body["state"] == "completed").then_some(())
            }
        },
    )
    .await;

    // SIGHUP: a new certificate from another CA, without a restart.
    let second_ca = make_certificates(dir.path(), "second");
    // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
    assert_eq!(
        unsafe { libc::kill(server.pid() as libc::pid_t, libc::SIGHUP) },
        0
    );
    let renewed = trusting(&second_ca);
    let health_url = server.endpoint("/healthz");
    wait_for("the new certificate", Duration::from_secs(10), || {
        let (renewed, url) = (renewed.clone(), health_url.clone());
        async move { renewed.get(&url).send().await.ok().map(|_| ()) }
    })
    .await;
    let fresh_old_client = trusting(&ca_file);
    assert!(
        fresh_old_client
            .get(server.endpoint("/healthz"))
            .send()
            .await
            .is_err()
    );
}
