//! The status page in a real browser: headless Chromium, driven over WebDriver by
//! chromedriver, against a running server. It must show the queues, follow the event log
//! live, and show a task's timeline on lookup; the test saves a screenshot. With auth on, it
//! asks for a token first, keeps it for the tab, and streams the log with it.
//!
//! Needs Debian's `chromium` and `chromium-driver` (`.ci/run` installs them). Without them the
//! test says so and passes, unless `SLUICE_REQUIRE_BROWSER=1` (set by `.ci/run`) makes it fail.

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;
use sluice_tests::*;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// chromedriver on a port of its own, killed with the test: its whole process group, so the
/// Chromium it started goes too, even when a failed assertion skipped closing the session.
struct Driver {
    child: Child,
    url: String,
}

impl Drop for Driver {
    fn drop(&mut self) {
        // The group's id is chromedriver's pid (`process_group(0)`).
        let group = -(self.child.id() as libc::pid_t);
        // SAFETY: kill(2) with a negative pid signals that process group; no memory involved.
        unsafe { libc::kill(group, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

async fn start_driver() -> Driver {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new(CHROMEDRIVER)
        .process_group(0)
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start chromedriver");
    let driver = Driver {
        child,
        url: format!("http://127.0.0.1:{port}"),
    };
    // Ready when its status endpoint answers; the deadline turns a hang into a failure.
    let client = http();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(response) = client.get(format!("{}/status", driver.url)).send().await
            && response.status().is_success()
        {
            return driver;
        }
        assert!(Instant::now() < deadline, "chromedriver did not start");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn browser(driver: &Driver, profile: &Path) -> Client {
    let capabilities = json!({
        "browserName": "chrome",
        "goog:chromeOptions": {
            "binary": CHROMIUM,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--disable-quic", "--window-size=1280,1100",
                format!("--user-data-dir={}", profile.display()),
            ],
        },
    });
    let capabilities = match capabilities {
        Value::Object(map) => map,
        _ => unreachable!("an object literal"),
    };
    ClientBuilder::new(HttpConnector::new())
        .capabilities(capabilities)
        .connect(&driver.url)
        .await
        .expect("a Chromium session")
}

/// Waits until the element `css` shows exactly `text`.
async fn wait_for_text(page: &Client, css: &str, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = String::new();
    while Instant::now() < deadline {
        if let Ok(element) = page.find(Locator::Css(css)).await {
            last = element.text().await.unwrap_or_default();
            if last == text {
                return;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{css} shows {last:?}, not {text:?}");
}

async fn texts(page: &Client, css: &str) -> Vec<String> {
    let mut out = Vec::new();
    for element in page
        .find_all(Locator::Css(css))
        .await
        .expect("find elements")
    {
        out.push(element.text().await.expect("element text"));
    }
    out
}

/// Waits until the recent events list a line about task `id`.
async fn wait_for_event_of(page: &Client, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !texts(page, "#events li")
        .await
        .iter()
        .any(|line| line.contains(id))
    {
        assert!(
            Instant::now() < deadline,
            "the events of {id} did not stream in"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Types `id` into the lookup box, replacing what was there, and asks for it.
async fn look_up(page: &Client, id: &str) {
    let input = page.find(Locator::Id("lookup-id")).await.unwrap();
    input.clear().await.unwrap();
    input.send_keys(id).await.unwrap();
    page.find(Locator::Id("lookup-go"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

async fn submit(client: &reqwest::Client, server: &Server, priority: &str) -> String {
    let body = json!({"kind": "oct.segment", "device": "oct-ward-3", "priority": priority,
        "est_exec_ms": 60000, "payload": {}});
    let answer = post_json(client, &server.endpoint("/v1/tasks"), &body).await;
    assert_eq!(answer.status, 201, "{:?}", answer.body);
    answer.body["id"].as_str().unwrap().to_owned()
}

/// Whether the browser is missing (the test then passes, unless `SLUICE_REQUIRE_BROWSER=1`).
fn no_browser() -> bool {
    if Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists() {
        return false;
    }
    let required = std::env::var("SLUICE_REQUIRE_BROWSER").is_ok_and(|v| v == "1");
    assert!(
        !required,
        "SLUICE_REQUIRE_BROWSER=1 but {CHROMIUM} or {CHROMEDRIVER} is missing: apt-get install chromium chromium-driver"
    );
    eprintln!("SKIPPED: no {CHROMIUM} / {CHROMEDRIVER} (apt-get install chromium chromium-driver)");
    true
}

/// A server sampling its history every 200 ms, so a test sees several samples at once.
fn fast_history_server(dir: &Path) -> Server {
    let config = dir.join("sluice.toml");
    std::fs::write(&config, "history_interval_ms = 200\n").unwrap();
    Server::start_with(&dir.join("data"), &["--config", config.to_str().unwrap()])
}

/// The bucket figures of every sample in `/v1/stats/history` so far.
async fn history(client: &reqwest::Client, server: &Server) -> Vec<serde_json::Value> {
    let answer = get_json(client, &server.endpoint("/v1/stats/history")).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    assert_eq!(answer.body["interval_ms"], 200);
    assert_eq!(answer.body["span_ms"], 900_000);
    answer.body["samples"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_history_samples_queue_depth_and_each_intervals_waits_per_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let server = fast_history_server(dir.path());
    let client = http();
    for priority in ["low", "low", "urgent"] {
        submit(&client, &server, priority).await;
    }
    // Samples come in until one shows the queues as they are now.
    let queued = |sample: &serde_json::Value| {
        ["urgent", "normal", "low"].map(|bucket| sample[bucket]["queued"].as_u64().unwrap())
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !history(&client, &server)
        .await
        .iter()
        .any(|sample| queued(sample) == [1, 0, 2])
    {
        assert!(
            Instant::now() < deadline,
            "no sample shows 1 urgent and 2 low queued"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Claim all three: one interval or two count three first claims, with their waits.
    let heartbeat = json!({"gpus": [{"model": "A100", "memory_mb": 40000}], "max_concurrency": 4});
    let url = server.endpoint("/v1/workers/w/heartbeat");
    assert_eq!(post_json(&client, &url, &heartbeat).await.status, 200);
    let claim = post_json(
        &client,
        &server.endpoint("/v1/workers/w/claim"),
        &json!({"max": 3, "wait_ms": 5000}),
    )
    .await;
    assert_eq!(claim.body["leases"].as_array().unwrap().len(), 3);
    let claimed = |samples: &[serde_json::Value], bucket: &str| -> u64 {
        samples
            .iter()
            .map(|s| s[bucket]["claimed"].as_u64().unwrap())
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let samples = loop {
        let samples = history(&client, &server).await;
        if claimed(&samples, "low") == 2 && queued(samples.last().unwrap()) == [0, 0, 0] {
            break samples;
        }
        assert!(
            Instant::now() < deadline,
            "the claims are not sampled: {samples:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(claimed(&samples, "urgent"), 1);
    assert_eq!(claimed(&samples, "normal"), 0);
    for sample in &samples {
        let low = &sample["low"];
        // An interval without claims has no wait figures; one with claims has both.
        assert_eq!(
            low["claimed"].as_u64().unwrap() > 0,
            low["wait_ms_p99"].is_u64(),
            "{sample}"
        );
        if let (Some(p50), Some(p99)) = (low["wait_ms_p50"].as_u64(), low["wait_ms_p99"].as_u64()) {
            assert!(p50 <= p99, "{sample}");
        }
    }
    let times: Vec<u64> = samples
        .iter()
        .map(|s| s["at_ms"].as_u64().unwrap())
        .collect();
    assert!(times.is_sorted() && times.len() >= 2, "{times:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_shows_queues_live_events_and_a_task_timeline_in_chromium() {
    if no_browser() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = fast_history_server(dir.path());
    let client = http();

    // A live experiment every task below is assigned to, for the experiments table.
    let experiment = post_json(
        &client,
        &server.endpoint("/v1/experiments"),
        &json!({"kind": "aging", "variants": [
            {"name": "A", "version": 0}, {"name": "B", "version": 0}]}),
    )
    .await;
    assert_eq!(experiment.status, 201, "{:?}", experiment.body);

    // One task run to completion, for the lookup; then 3 urgent, 2 normal and 4 low waiting.
    let heartbeat = json!({"gpus": [{"model": "A100", "memory_mb": 40000}], "max_concurrency": 4});
    let worker = post_json(
        &client,
        &server.endpoint("/v1/workers/gpu-7/heartbeat"),
        &heartbeat,
    )
    .await;
    assert_eq!(worker.status, 200, "{:?}", worker.body);
    let done = submit(&client, &server, "normal").await;
    let claim = post_json(
        &client,
        &server.endpoint("/v1/workers/gpu-7/claim"),
        &json!({"max": 1, "wait_ms": 5000}),
    )
    .await;
    let token = claim.body["leases"][0]["lease_token"]
        .as_str()
        .unwrap()
        .to_owned();
    for (report, body) in [
        ("start", json!({"lease_token": token})),
        (
            "complete",
            json!({"lease_token": token, "result": {"segments": 12}}),
        ),
    ] {
        let url = server.endpoint(&format!("/v1/tasks/{done}/{report}"));
        assert_eq!(post_json(&client, &url, &body).await.status, 200);
    }
    for priority in [
        "urgent", "urgent", "urgent", "normal", "normal", "low", "low", "low", "low",
    ] {
        submit(&client, &server, priority).await;
    }

    let driver = start_driver().await;
    let page = browser(&driver, &dir.path().join("chromium-profile")).await;
    page.goto(&server.endpoint("/"))
        .await
        .expect("open the status page");
    assert_eq!(page.title().await.unwrap(), "Sluice status");

    wait_for_text(&page, "#queue-urgent", "3").await;
    let report = get_json(&client, &server.endpoint("/v1/experiments/1"))
        .await
        .body;
    for variant in report["variants"].as_array().unwrap() {
        let css = format!("#experiment-1-{}-tasks", variant["name"].as_str().unwrap());
        wait_for_text(&page, &css, &variant["tasks"].to_string()).await;
    }
    wait_for_text(&page, "#queue-normal", "2").await;
    wait_for_text(&page, "#queue-low", "4").await;
    wait_for_text(&page, "#state-completed", "1").await;
    wait_for_text(&page, "#state-queued", "9").await;
    wait_for_text(&page, "#health", "ready").await;
    let workers = texts(&page, "#workers tbody tr td:first-child").await;
    assert_eq!(workers, ["gpu-7"]);
    wait_for_text(&page, "#workers tbody tr td.breaker", "closed").await;
    let policies = texts(&page, "#policies tbody tr td:first-child").await;
    assert_eq!(policies.len(), 5, "{policies:?}");
    // The log so far: 10 tasks created and queued, one claimed, started and completed.
    let deadline = Instant::now() + Duration::from_secs(30);
    while texts(&page, "#events li").await.len() < 23 {
        assert!(
            Instant::now() < deadline,
            "the recent events did not arrive"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_for_text(&page, "#stream-state", "live").await;

    // The charts: a line of queued tasks per bucket, and the claimed task's wait.
    for css in [
        "#chart-queued polyline[data-bucket='urgent']",
        "#chart-queued polyline[data-bucket='normal']",
        "#chart-queued polyline[data-bucket='low']",
        "#chart-wait [data-bucket='normal']",
    ] {
        page.wait()
            .at_most(Duration::from_secs(30))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|error| panic!("{css} is not drawn: {error}"));
    }
    wait_for_text(&page, "#history-interval", "200 ms").await;

    // Live: a task submitted now shows in the stream and in the queue numbers.
    let late = submit(&client, &server, "urgent").await;
    wait_for_text(&page, "#queue-urgent", "4").await;
    wait_for_event_of(&page, &late).await;

    // Lookup: the completed task's timeline, step by step.
    look_up(&page, &done).await;
    page.wait()
        .for_element(Locator::Css("#timeline li[data-to='completed']"))
        .await
        .expect("the timeline shows the completion");
    let mut steps = Vec::new();
    for item in page.find_all(Locator::Css("#timeline li")).await.unwrap() {
        steps.push(item.attr("data-to").await.unwrap().unwrap_or_default());
    }
    assert_eq!(
        steps,
        ["created", "queued", "claimed", "running", "completed"]
    );
    let summary = page
        .find(Locator::Id("task-summary"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        summary.contains(&done) && summary.contains("gpu-7"),
        "{summary}"
    );

    // A lookup of a task that does not exist says so.
    look_up(&page, "01ARZ3NDEKTSV4RRFFQ69G5FAV").await;
    page.wait()
        .for_element(Locator::Css("#lookup-error:not([hidden])"))
        .await
        .expect("the lookup reports the missing task");

    // Back to the found task for the screenshot.
    look_up(&page, &done).await;
    page.wait()
        .for_element(Locator::Css("#lookup-result:not([hidden]) #timeline li"))
        .await
        .unwrap();
    let png = page.screenshot().await.expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "not a PNG");
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("status-page.png");
    std::fs::write(&shot, &png).expect("save the screenshot");
    println!("status page screenshot: {}", shot.display());
    page.close().await.expect("end the browser session");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_on_the_status_page_asks_for_a_viewer_token_and_streams_with_it() {
    if no_browser() {
        return;
    }
    const ROOT: &str = "root-token-for-the-page-test";
    let dir = tempfile::tempdir().unwrap();
    let server = Server::launch(
        &dir.path().join("data"),
        &[],
        &[("SLUICE_ADMIN_TOKEN", ROOT)],
        None,
    );
    let admin = http_as(ROOT);
    let (viewer, _) = issue_token(&admin, &server, &json!({"role": "viewer"})).await;
    for priority in ["urgent", "urgent", "low"] {
        submit(&admin, &server, priority).await;
    }

    let driver = start_driver().await;
    let page = browser(&driver, &dir.path().join("chromium-profile")).await;
    page.goto(&server.endpoint("/"))
        .await
        .expect("open the status page");
    page.wait()
        .for_element(Locator::Css("#token-form:not([hidden])"))
        .await
        .expect("the page asks for a token");
    wait_for_text(&page, "#health", "needs a token").await;
    assert_eq!(
        page.find(Locator::Id("queue-urgent"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap(),
        "–"
    );

    let input = page.find(Locator::Id("token-input")).await.unwrap();
    input.send_keys(&viewer).await.unwrap();
    page.find(Locator::Id("token-go"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_for_text(&page, "#queue-urgent", "2").await;
    wait_for_text(&page, "#queue-low", "1").await;
    wait_for_text(&page, "#health", "ready").await;
    wait_for_text(&page, "#stream-state", "live").await;
    page.wait()
        .for_element(Locator::Css("#policies-forbidden:not([hidden])"))
        .await
        .expect("a viewer is told policies are for admins");
    let late = submit(&admin, &server, "urgent").await;
    wait_for_event_of(&page, &late).await;
    // The token stays in the tab: a reload does not ask again.
    page.refresh().await.unwrap();
    wait_for_text(&page, "#queue-urgent", "3").await;
    let form_hidden = page
        .find(Locator::Id("token-form"))
        .await
        .unwrap()
        .attr("hidden")
        .await
        .unwrap();
    assert!(form_hidden.is_some(), "the page asked for the token again");
    page.close().await.expect("end the browser session");
}

/// `sluice sim`'s plots open in the browser as pictures: an SVG document whose lines have a
/// size on the page (a malformed file would show Chromium's XML error page instead).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_simulations_svg_plots_render_in_chromium() {
    if no_browser() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.jsonl");
    let out = dir.path().join("sim");
    let generated = run_sluice(
        &[
            "trace", "gen", "--tasks", "400", "--seed", "2", "--shape", "burst",
        ],
        &[],
    );
    std::fs::write(&trace, succeeded(generated)).unwrap();
    succeeded(run_sluice(
        &[
            "sim",
            "--trace",
            trace.to_str().unwrap(),
            "--workers",
            "2x2",
            "--compare",
            "aging=builtin:aging-age-factor?max_age_ms=20000",
            "--out",
            out.to_str().unwrap(),
        ],
        &[],
    ));
    let driver = start_driver().await;
    let page = browser(&driver, &dir.path().join("chromium-profile")).await;
    for (plot, lines) in [("wait-cdf.svg", 6), ("queue-depth.svg", 6)] {
        let url = format!("file://{}", out.join(plot).display());
        page.goto(&url).await.expect("open the plot");
        let drawn = page
            .execute(
                "const svg = document.documentElement;
                 const lines = [...document.querySelectorAll('polyline')];
                 return [svg.localName, lines.length,
                         lines.filter(l => {
                             const box = l.getBBox();
                             return box.width + box.height > 50;
                         }).length];",
                vec![],
            )
            .await
            .expect("measure the plot");
        assert_eq!(drawn, json!(["svg", lines, lines]), "{plot}");
        let png = page.screenshot().await.expect("a screenshot");
        assert!(png.len() > 1_000, "{plot}: an empty screenshot");
    }
    page.close().await.unwrap();
}
