//! Tokens and roles on a real server: no token is 401 everywhere but the liveness probe and
//! the page shell; devices see only their own tasks; workers act only as themselves; policy
//! and token routes are an admin's; tokens survive a restart and a revoked one is refused at
//! once; every admin action is in the audit log; an open server stays on loopback.

use sluice_tests::*;
use std::process::{Command, Stdio};

const ROOT: &str = "root-token-for-the-auth-test";

fn start(data: &std::path::Path) -> Server {
    Server::launch(data, &[], &[("SLUICE_ADMIN_TOKEN", ROOT)], None)
}

/// Every route with a concrete path, and a body that would be valid for it.
fn routes(task: &str) -> Vec<(reqwest::Method, String)> {
    use reqwest::Method;
    let mut routes = vec![
        (Method::GET, "/readyz".to_owned()),
        (Method::GET, "/metrics".into()),
        (Method::GET, "/v1/stats".into()),
        (Method::GET, "/v1/events".into()),
        (Method::POST, "/v1/tasks".into()),
        (Method::GET, "/v1/tasks".into()),
        (Method::POST, "/v1/tasks:batch".into()),
        (Method::POST, "/v1/reports".into()),
        (Method::GET, "/v1/workers".into()),
        (Method::POST, "/v1/workers/gpu-1/heartbeat".into()),
        (Method::POST, "/v1/workers/gpu-1/claim".into()),
        (Method::POST, "/v1/workers/gpu-1/reset".into()),
        (Method::GET, "/v1/worker-events".into()),
        (Method::GET, "/v1/no-such-route".into()),
    ];
    for suffix in ["", "/events"] {
        routes.push((Method::GET, format!("/v1/tasks/{task}{suffix}")));
    }
    for report in [
        "cancel",
        "start",
        "heartbeat",
        "complete",
        "fail",
        "stopped",
    ] {
        routes.push((Method::POST, format!("/v1/tasks/{task}/{report}")));
    }
    routes.extend(admin_routes());
    routes
}

/// The policy, token and audit routes.
fn admin_routes() -> Vec<(reqwest::Method, String)> {
    use reqwest::Method;
    vec![
        (Method::GET, "/v1/policies".to_owned()),
        (Method::GET, "/v1/policies/retry".into()),
        (Method::PUT, "/v1/policies/retry".into()),
        (Method::POST, "/v1/policies/retry/activate".into()),
        (Method::POST, "/v1/policies/retry/rollback".into()),
        (Method::GET, "/v1/tokens".into()),
        (Method::POST, "/v1/tokens".into()),
        (Method::DELETE, "/v1/tokens/tok_0000".into()),
        (Method::GET, "/v1/audit".into()),
    ]
}

async fn call(
    client: &reqwest::Client,
    server: &Server,
    method: reqwest::Method,
    path: &str,
) -> Answer {
    let request = client
        .request(method, server.endpoint(path))
        .header("content-type", "application/json")
        .body("{}");
    answer(request.send().await.expect("request")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_scope_every_route_and_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let server = start(&data);
    let admin = http_as(ROOT);
    let anonymous = http();

    // No token: 401 everywhere but the probe and the page shell.
    let probe = get_json(&anonymous, &server.endpoint("/healthz")).await;
    assert_eq!(probe.status, 200);
    for path in ["/", "/assets/app.js"] {
        let page = anonymous.get(server.endpoint(path)).send().await.unwrap();
        assert_eq!(page.status(), 200, "{path}");
    }
    let some_task = "01J00000000000000000000000";
    for (method, path) in routes(some_task) {
        let refused = call(&anonymous, &server, method.clone(), &path).await;
        assert_problem(&refused, 401, "unauthorized");
        let wrong = call(
            &http_as("sluice_not-a-token"),
            &server,
            method.clone(),
            &path,
        )
        .await;
        assert_problem(&wrong, 401, "unauthorized");
    }

    let (device_a, _) = issue_token(
        &admin,
        &server,
        &json!({"role": "device", "device": "scanner-a", "tenant": "site-1"}),
    )
    .await;
    let (device_b, device_b_id) = issue_token(
        &admin,
        &server,
        &json!({"role": "device", "device": "scanner-b", "tenant": "site-1"}),
    )
    .await;
    let (worker_1, _) = issue_token(
        &admin,
        &server,
        &json!({"role": "worker", "worker": "gpu-1"}),
    )
    .await;
    let (worker_2, _) = issue_token(
        &admin,
        &server,
        &json!({"role": "worker", "worker": "gpu-2"}),
    )
    .await;
    let (viewer, _) = issue_token(&admin, &server, &json!({"role": "viewer"})).await;
    let (a, b) = (http_as(&device_a), http_as(&device_b));
    let (w1, w2) = (http_as(&worker_1), http_as(&worker_2));

    // A device submits as itself, whatever the body says.
    let submitted = post_json(
        &a,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "oct.scan", "device": "scanner-b", "tenant": "site-9"}),
    )
    .await;
    assert_eq!(submitted.status, 201, "{:?}", submitted.body);
    assert_eq!(submitted.body["device"], "scanner-a");
    assert_eq!(submitted.body["tenant"], "site-1");
    let id = submitted.body["id"].as_str().unwrap().to_owned();

    // Another device cannot get, list, follow or cancel it: to it the task does not exist.
    let own = get_json(&a, &server.endpoint(&format!("/v1/tasks/{id}"))).await;
    assert_eq!(own.status, 200);
    for path in [format!("/v1/tasks/{id}"), format!("/v1/tasks/{id}/events")] {
        assert_problem(
            &get_json(&b, &server.endpoint(&path)).await,
            404,
            "task-not-found",
        );
    }
    let cancel = post_json(
        &b,
        &server.endpoint(&format!("/v1/tasks/{id}/cancel")),
        &json!({}),
    )
    .await;
    assert_problem(&cancel, 404, "task-not-found");
    let listed_by_b = get_json(&b, &server.endpoint("/v1/tasks?device=scanner-a")).await;
    assert_eq!(listed_by_b.status, 200);
    assert_eq!(listed_by_b.body["tasks"].as_array().unwrap().len(), 0);
    let listed_by_a = get_json(&a, &server.endpoint("/v1/tasks")).await;
    assert_eq!(listed_by_a.body["tasks"].as_array().unwrap().len(), 1);

    // Devices and viewers get 403 on every policy and token route; workers too.
    for token in [&device_a, &viewer, &worker_1] {
        for (method, path) in admin_routes() {
            let refused = call(&http_as(token), &server, method, &path).await;
            assert_problem(&refused, 403, "forbidden");
        }
    }
    // A viewer reads; it does not submit.
    let stats = get_json(&http_as(&viewer), &server.endpoint("/v1/stats")).await;
    assert_eq!(stats.status, 200);
    let by_viewer = post_json(
        &http_as(&viewer),
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "x"}),
    )
    .await;
    assert_problem(&by_viewer, 403, "forbidden");

    // A worker heartbeats and claims only as itself, and reports only on its own leases.
    let as_other = post_json(
        &w1,
        &server.endpoint("/v1/workers/gpu-2/heartbeat"),
        &json!({"gpus": [{"model": "A100", "memory_mb": 40000}]}),
    )
    .await;
    assert_problem(&as_other, 403, "forbidden");
    let claim_as_other =
        post_json(&w1, &server.endpoint("/v1/workers/gpu-2/claim"), &json!({})).await;
    assert_problem(&claim_as_other, 403, "forbidden");
    register_worker(&w1, &server, "gpu-1", 1).await;
    register_worker(&w2, &server, "gpu-2", 1).await;
    let lease = claim_lease(&w1, &server, "gpu-1").await;
    assert_eq!(lease["task"]["id"], id.as_str());
    let lease_token = lease["lease_token"].as_str().unwrap();
    let body = json!({"lease_token": lease_token, "result": {"ok": true}});
    let stolen = report(&w2, &server, &id, "complete", body.clone()).await;
    assert_problem(&stolen, 404, "task-not-found");
    let batch = post_json(
        &w2,
        &server.endpoint("/v1/reports"),
        &json!({"reports": [{"report": "complete", "task": id, "lease_token": lease_token}]}),
    )
    .await;
    assert_eq!(batch.status, 200);
    assert_eq!(batch.body["results"][0]["status"], 404, "{:?}", batch.body);
    let done = report(&w1, &server, &id, "complete", body).await;
    assert_eq!(done.status, 200, "{:?}", done.body);
    assert_eq!(done.body["state"], "completed");

    // Revoked: refused from the next request on.
    let revoked = admin
        .delete(server.endpoint(&format!("/v1/tokens/{device_b_id}")))
        .send()
        .await
        .unwrap();
    assert_eq!(revoked.status(), 200);
    let after = get_json(&b, &server.endpoint("/v1/tasks")).await;
    assert_problem(&after, 401, "unauthorized");

    // The audit log names the acting token for every admin action.
    let reset = post_json(
        &admin,
        &server.endpoint("/v1/workers/gpu-1/reset"),
        &json!({}),
    )
    .await;
    assert_eq!(reset.status, 200, "{:?}", reset.body);
    let audit = get_json(&admin, &server.endpoint("/v1/audit")).await;
    let actions: Vec<_> = audit.body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["action"].as_str().unwrap().to_owned(),
                e["token_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    let expected: Vec<(String, String)> = [
        "token.issue",
        "token.issue",
        "token.issue",
        "token.issue",
        "token.issue",
        "token.revoke",
        "worker.reset",
    ]
    .iter()
    .map(|a| (a.to_string(), "bootstrap".to_string()))
    .collect();
    assert_eq!(actions, expected);
    let listed = get_json(&admin, &server.endpoint("/v1/tokens")).await;
    let tokens = listed.body["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 5);
    assert!(
        tokens
            .iter()
            .all(|t| t.get("sha256").is_none() && t.get("token").is_none())
    );

    // A restart keeps every token, and the revocation.
    assert!(server.terminate().success());
    let server = start(&data);
    let again = get_json(&a, &server.endpoint(&format!("/v1/tasks/{id}"))).await;
    assert_eq!(again.status, 200, "{:?}", again.body);
    assert_problem(
        &get_json(&b, &server.endpoint("/v1/tasks")).await,
        401,
        "unauthorized",
    );
    let audit = get_json(&admin, &server.endpoint("/v1/audit?after=6")).await;
    assert_eq!(audit.body["events"].as_array().unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_server_serves_loopback_until_its_first_admin_token() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"));
    assert!(server.announce.contains("auth: off"), "{}", server.announce);
    let anonymous = http();
    let open = post_json(
        &anonymous,
        &server.endpoint("/v1/tasks"),
        &json!({"kind": "x"}),
    )
    .await;
    assert_eq!(open.status, 201, "{:?}", open.body);
    // The first token of an open server must be an admin's, or no one could issue more.
    let viewer_first = post_json(
        &anonymous,
        &server.endpoint("/v1/tokens"),
        &json!({"role": "viewer"}),
    )
    .await;
    assert_problem(&viewer_first, 409, "token-conflict");
    let (admin_token, admin_id) = issue_token(&anonymous, &server, &json!({"role": "admin"})).await;
    let closed = get_json(&anonymous, &server.endpoint("/v1/tasks")).await;
    assert_problem(&closed, 401, "unauthorized");
    // The last admin token cannot be revoked while no bootstrap admin is configured.
    let admin = http_as(&admin_token);
    let last = admin
        .delete(server.endpoint(&format!("/v1/tokens/{admin_id}")))
        .send()
        .await
        .unwrap();
    assert_problem(&answer(last).await, 409, "token-conflict");
}

#[test]
fn serving_a_network_address_without_auth_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(sluice_binary())
        .args(["serve", "--listen", "0.0.0.0:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("SLUICE_LOG", "warn")
        .env_remove("SLUICE_ADMIN_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("without auth"), "{stderr}");

    // With --insecure-no-auth it serves, says so on its first line, and warns.
    let server = Server::launch(
        &dir.path().join("data"),
        &["--insecure-no-auth"],
        &[],
        Some(&dir.path().join("log")),
    );
    assert!(
        server.announce.contains("auth: DISABLED"),
        "{}",
        server.announce
    );
    let status = std::process::Command::new(sluice_binary())
        .args(["task", "list", "--server", &server.url])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(status.success());
    let log = std::fs::read_to_string(dir.path().join("log")).unwrap();
    assert!(log.contains("auth is disabled"), "{log}");
}

/// A task an admin's token submits is created in that token's name, not in the name of the
/// device its body names; a device's own task in the device's.
#[tokio::test]
async fn a_task_is_created_in_the_name_of_the_token_that_submitted_it() {
    let dir = tempfile::tempdir().unwrap();
    let server = start(&dir.path().join("data"));
    let admin = http_as(ROOT);
    let (device, _) = issue_token(
        &admin,
        &server,
        &json!({"role": "device", "device": "scanner-a", "tenant": "site-1"}),
    )
    .await;
    let creator = |client: reqwest::Client, body: serde_json::Value| {
        let server = &server;
        async move {
            let submitted = post_json(&client, &server.endpoint("/v1/tasks"), &body).await;
            assert_eq!(submitted.status, 201, "{:?}", submitted.body);
            let id = submitted.body["id"].as_str().unwrap().to_owned();
            let events =
                get_json(&client, &server.endpoint(&format!("/v1/tasks/{id}/events"))).await;
            events.body["events"][0]["actor"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    let by_admin = creator(
        admin.clone(),
        json!({"kind": "oct.scan", "device": "scanner-z"}),
    )
    .await;
    assert_eq!(by_admin, "admin:bootstrap");
    let by_device = creator(http_as(&device), json!({"kind": "oct.scan"})).await;
    assert_eq!(by_device, "device:scanner-a");
}
