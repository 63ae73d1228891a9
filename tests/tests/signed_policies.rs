//! Signed policy components on a real server with `policy_signing_keys`: a key pair and a
//! signature made by the CLI activate; one flipped byte in the component or the signature, a
//! key the server does not trust, or no signature at all is refused 422 (check `signature`)
//! and nothing is stored; the signing key's id is kept with the version and in the audit log.

use sluice_tests::*;
use std::path::Path;
use std::process::Output;

const ROOT: &str = "root-token-for-the-signing-test";

fn sluice(args: &[&str]) -> Output {
    run_sluice(args, &[("SLUICE_TOKEN", ROOT)])
}

/// Makes a key pair with the CLI; answers the config line it printed.
fn keygen(dir: &Path, id: &str) -> String {
    let key = dir.join(format!("{id}.key"));
    let printed = succeeded(sluice(&[
        "policy",
        "keygen",
        "--id",
        id,
        "--out",
        key.to_str().unwrap(),
    ]));
    let mode = std::fs::metadata(&key).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o600
    );
    printed
        .lines()
        .find(|line| line.starts_with("policy_signing_keys"))
        .expect("the config line")
        .to_owned()
}

fn sign(dir: &Path, id: &str, component: &Path) -> String {
    let key = dir.join(format!("{id}.key"));
    succeeded(sluice(&[
        "policy",
        "sign",
        "--key",
        key.to_str().unwrap(),
        component.to_str().unwrap(),
    ]));
    let mut name = component.as_os_str().to_owned();
    name.push(".sig");
    std::fs::read_to_string(name).unwrap().trim().to_owned()
}

async fn upload(server: &Server, bytes: Vec<u8>, signature: Option<&str>) -> Answer {
    let mut request = http_as(ROOT)
        .put(server.endpoint("/v1/policies/retry"))
        .header("content-type", "application/wasm")
        .body(bytes);
    if let Some(signature) = signature {
        request = request.header("sluice-signature", signature);
    }
    answer(request.send().await.unwrap()).await
}

fn assert_signature_refused(answer: &Answer, says: &str) {
    assert_problem(answer, 422, "policy-refused");
    assert_eq!(answer.body["check"], "signature", "{:?}", answer.body);
    let detail = answer.body["detail"].as_str().unwrap();
    assert!(detail.contains(says), "{detail}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_components_signed_by_a_trusted_key_are_stored() {
    let dir = tempfile::tempdir().unwrap();
    let trusted = keygen(dir.path(), "ops-1");
    keygen(dir.path(), "ops-2");
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, format!("{trusted}\n")).unwrap();
    let server = Server::launch(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
        &[("SLUICE_ADMIN_TOKEN", ROOT)],
        None,
    );
    let module = sluice_policy_runtime::defaults::by_name("retry-backoff")
        .unwrap()
        .to_vec();
    let component = dir.path().join("retry.wasm");
    std::fs::write(&component, &module).unwrap();
    let signature = sign(dir.path(), "ops-1", &component);

    // Refused, and nothing stored: no signature, a flipped byte in the component or in the
    // signature, a key the server does not trust.
    assert_signature_refused(
        &upload(&server, module.clone(), None).await,
        "Sluice-Signature",
    );
    let mut flipped = module.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x01;
    assert_signature_refused(
        &upload(&server, flipped, Some(&signature)).await,
        "does not match",
    );
    let (head, sig) = signature.split_once("sig=").unwrap();
    let mut sig_bytes: Vec<char> = sig.chars().collect();
    sig_bytes[5] = if sig_bytes[5] == 'A' { 'B' } else { 'A' };
    let forged = format!("{head}sig={}", sig_bytes.into_iter().collect::<String>());
    assert_signature_refused(
        &upload(&server, module.clone(), Some(&forged)).await,
        "does not match",
    );
    let other = dir.path().join("other.wasm");
    std::fs::write(&other, &module).unwrap();
    let by_untrusted = sign(dir.path(), "ops-2", &other);
    assert_signature_refused(
        &upload(&server, module.clone(), Some(&by_untrusted)).await,
        "ops-2",
    );
    assert_signature_refused(
        &upload(&server, module.clone(), Some("keyid=ops-1")).await,
        "malformed",
    );
    let detail = get_json(&http_as(ROOT), &server.endpoint("/v1/policies/retry")).await;
    assert_eq!(
        detail.body["versions"].as_array().unwrap().len(),
        0,
        "{:?}",
        detail.body
    );

    // The CLI's upload sends the signature beside the file; the version keeps its key id.
    let uploaded = succeeded(sluice(&[
        "policy",
        "upload",
        "--server",
        &server.url,
        "retry",
        component.to_str().unwrap(),
    ]));
    let uploaded: Value = serde_json::from_str(&uploaded).unwrap();
    assert_eq!(uploaded["version"], 1);
    assert_eq!(uploaded["signed_by"], "ops-1");
    succeeded(sluice(&[
        "policy",
        "activate",
        "--server",
        &server.url,
        "retry",
        "1",
    ]));
    let detail = get_json(&http_as(ROOT), &server.endpoint("/v1/policies/retry")).await;
    assert_eq!(detail.body["active_version"], 1, "{:?}", detail.body);
    assert_eq!(detail.body["versions"][0]["signed_by"], "ops-1");
    let uploaded_event = detail.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["action"] == "uploaded")
        .cloned()
        .unwrap();
    assert_eq!(uploaded_event["signed_by"], "ops-1");

    // A flipped byte through the CLI is refused with a non-zero exit.
    let mut flipped = module.clone();
    flipped[middle] ^= 0x01;
    let bad = dir.path().join("bad.wasm");
    std::fs::write(&bad, flipped).unwrap();
    let refused = sluice(&[
        "policy",
        "upload",
        "--server",
        &server.url,
        "retry",
        bad.to_str().unwrap(),
        "--signature",
        &format!("{}.sig", component.display()),
    ]);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("signature"));

    let audit = get_json(&http_as(ROOT), &server.endpoint("/v1/audit")).await;
    let events = audit.body["events"].as_array().unwrap();
    let actions: Vec<_> = events
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["policy.upload", "policy.activate"]);
    assert!(
        events[0]["detail"]
            .as_str()
            .unwrap()
            .contains("signed_by=ops-1")
    );

    // Data blobs are signed as components are: split-ivf's centroids, raw f32 rows.
    let ivf = dir.path().join("split_ivf.wasm");
    std::fs::write(
        &ivf,
        sluice_policy_runtime::defaults::by_name("split-ivf").unwrap(),
    )
    .unwrap();
    sign(dir.path(), "ops-1", &ivf);
    let uploaded = succeeded(sluice(&[
        "policy",
        "upload",
        "--server",
        &server.url,
        "split",
        ivf.to_str().unwrap(),
        "--config",
        "dim=2",
    ]));
    let version = serde_json::from_str::<Value>(&uploaded).unwrap()["version"]
        .as_u64()
        .unwrap();
    let centroids: Vec<u8> = [0.0f32, 0.0, 10.0, 10.0]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let blob = dir.path().join("centroids.f32");
    std::fs::write(&blob, &centroids).unwrap();
    let url = server.endpoint(&format!("/v1/policies/split/{version}/data/centroids"));
    let unsigned = answer(
        http_as(ROOT)
            .put(&url)
            .header("content-type", "application/octet-stream")
            .body(centroids.clone())
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_signature_refused(&unsigned, "Sluice-Signature");
    let signed = sign(dir.path(), "ops-1", &blob);
    let stored = answer(
        http_as(ROOT)
            .put(&url)
            .header("content-type", "application/octet-stream")
            .header("sluice-signature", signed)
            .body(centroids)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(stored.status, 201, "{:?}", stored.body);
}
