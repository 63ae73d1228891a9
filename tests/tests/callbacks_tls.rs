//! https callbacks: a completion callback to a local rustls server whose certificate is signed
//! by a CA made for this test is delivered when `--callback-ca-file` names that CA, and fails
//! (as a callback attempt on the timeline) when it does not.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};
use sluice_tests::*;
use std::sync::Arc;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

/// A CA (its PEM) and a TLS acceptor for 127.0.0.1 with a certificate it signed.
fn test_ca_and_acceptor() -> (String, tokio_rustls::TlsAcceptor) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "Sluice test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let mut leaf_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf_params.subject_alt_names = vec![SanType::IpAddress("127.0.0.1".parse().unwrap())];
    let leaf = leaf_params.signed_by(&leaf_key, &ca, &ca_key).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf_key.serialize_der()));
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .unwrap();
    (ca.pem(), tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

/// Submits a task with `callback_url`, has a worker complete it, and waits for the first
/// callback event on its timeline; answers that event's detail.
async fn complete_and_wait_for_the_callback(server: &Server, callback_url: &str) -> String {
    let client = http();
    let body = json!({"kind": "oct.scan", "callback_url": callback_url});
    let submitted = post_json(&client, &server.endpoint("/v1/tasks"), &body).await;
    assert_eq!(submitted.status, 201, "{:?}", submitted.body);
    let id = submitted.body["id"].as_str().unwrap().to_owned();
    register_worker(&client, server, "w", 1).await;
    let lease = claim_lease(&client, server, "w").await;
    let token = lease["lease_token"].as_str().unwrap();
    let body = json!({"lease_token": token, "result": {"findings": 0}});
    let done = report(&client, server, &id, "complete", body).await;
    assert_eq!(done.status, 200, "{:?}", done.body);
    let url = server.endpoint(&format!("/v1/tasks/{id}/events"));
    wait_for(
        "a callback event",
        std::time::Duration::from_secs(20),
        || {
            let (client, url) = (client.clone(), url.clone());
            async move {
                let events = get_json(&client, &url).await;
                events.body["events"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|e| e["detail"].as_str())
                    .find(|d| d.starts_with("callback"))
                    .map(str::to_owned)
            }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_callback_signed_by_the_configured_ca_is_delivered() {
    let (ca_pem, acceptor) = test_ca_and_acceptor();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca_pem).unwrap();
    let data = dir.path().join("data");
    let server = Server::start_with(
        &data,
        &[
            "--callback-allow",
            "127.0.0.1",
            "--callback-ca-file",
            ca_file.to_str().unwrap(),
        ],
    );
    let (url, mut bodies) = callback_receiver(vec![200], Some(acceptor)).await;
    assert!(url.starts_with("https://"));
    let detail = complete_and_wait_for_the_callback(&server, &url).await;
    assert!(detail.contains("attempt 1 delivered"), "{detail}");
    let body = bodies.recv().await.unwrap();
    assert_eq!(body["state"], "completed");
    assert_eq!(body["result"]["findings"], 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_callback_to_a_server_no_trusted_ca_signed_fails() {
    let (_, acceptor) = test_ca_and_acceptor();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(dir.path(), &["--callback-allow", "127.0.0.1"]);
    let (url, _bodies) = callback_receiver(vec![200], Some(acceptor)).await;
    let detail = complete_and_wait_for_the_callback(&server, &url).await;
    assert!(detail.contains("attempt 1 failed"), "{detail}");
}

#[test]
fn a_callback_ca_file_without_a_certificate_stops_the_server_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, "not a certificate\n").unwrap();
    let output = std::process::Command::new(sluice_binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--callback-ca-file")
        .arg(&ca_file)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("callback_ca_file"), "{stderr}");
}
