// The status page: polls the JSON API the CLI uses and follows the event log live.
// Data is only ever written with textContent, never as HTML. When the server asks for a
// token (401), the page asks for one and keeps it in this tab's session storage only.
"use strict";

const BUCKETS = ["urgent", "normal", "low"];
const STATES = ["created", "queued", "claimed", "running", "retry_wait", "split", "merging",
  "completed", "failed", "dead", "cancelled", "timed_out"];
const POLL_MS = 2000;
const MAX_EVENTS_SHOWN = 50;

const $ = (id) => document.getElementById(id);

function text(id, value) {
  const element = $(id);
  if (element) element.textContent = value;
}

function cell(row, value, className) {
  const td = document.createElement("td");
  td.textContent = value;
  if (className) td.className = className;
  row.appendChild(td);
  return td;
}

function duration(ms) {
  if (ms === undefined || ms === null) return "–";
  if (ms < 1000) return `${ms} ms`;
  const s = ms / 1000;
  if (s < 120) return `${s.toFixed(1)} s`;
  if (s < 7200) return `${(s / 60).toFixed(1)} min`;
  return `${(s / 3600).toFixed(1)} h`;
}

const TOKEN_KEY = "sluice-token";

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { authorization: `Bearer ${token}` } : {};
}

// Shows the token form, with why it is asked for.
function askForToken(reason) {
  $("token-form").hidden = false;
  const error = $("token-error");
  error.textContent = reason || "";
  error.hidden = !reason;
  setHealth("needs a token", "warn");
}

class HttpError extends Error {
  constructor(message, status) {
    super(message);
    this.status = status;
  }
}

async function getJson(path) {
  const response = await fetch(path, { headers: { accept: "application/json", ...authHeaders() } });
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const detail = body && (body.detail || body.title);
    if (response.status === 401) askForToken(sessionStorage.getItem(TOKEN_KEY) ? detail : "");
    throw new HttpError(detail || `${path}: HTTP ${response.status}`, response.status);
  }
  return body;
}

// A reader whose token may not see a part (a viewer and the policies) gets null for it.
function unlessForbidden(request) {
  return request.catch((error) => (error.status === 403 ? null : Promise.reject(error)));
}

function renderStats(stats) {
  for (const bucket of BUCKETS) {
    text(`queue-${bucket}`, String(stats.queued_by_bucket?.[bucket] ?? 0));
    text(`wait-${bucket}`, duration(stats.oldest_wait_ms_by_bucket?.[bucket]));
  }
  (stats.bucket_weights || []).forEach((weight, i) => text(`weight-${BUCKETS[i]}`, String(weight)));
  const body = $("states").tBodies[0];
  body.replaceChildren();
  for (const state of STATES) {
    const row = document.createElement("tr");
    cell(row, state);
    cell(row, String(stats.tasks_by_state?.[state] ?? 0), "num").id = `state-${state}`;
    body.appendChild(row);
  }
}

function renderWorkers(workers) {
  const body = $("workers").tBodies[0];
  body.replaceChildren();
  $("workers-empty").hidden = workers.length > 0;
  for (const worker of workers) {
    const row = document.createElement("tr");
    row.dataset.worker = worker.id;
    cell(row, worker.id);
    cell(row, worker.healthy ? "healthy" : "unhealthy", worker.healthy ? "ok" : "bad");
    cell(row, duration(worker.heartbeat_age_ms), "num");
    const breaker = worker.breaker?.state ?? "closed";
    cell(row, breaker, breaker === "closed" ? "ok" : breaker === "open" ? "bad" : "warn")
      .classList.add("breaker");
    cell(row, String(worker.leases), "num");
    cell(row, `${worker.free_gpus} / ${(worker.gpus || []).length}`, "num");
    cell(row, String(worker.claims_served), "num");
    body.appendChild(row);
  }
}

function renderPolicies(policies) {
  const body = $("policies").tBodies[0];
  body.replaceChildren();
  $("policies-forbidden").hidden = policies !== null;
  for (const policy of policies || []) {
    const row = document.createElement("tr");
    cell(row, policy.kind);
    cell(row, policy.active_version === 0 ? "0 (built-in)" : String(policy.active_version), "num");
    cell(row, String(policy.decisions_total), "num");
    cell(row, String(policy.faults_total), policy.faults_total > 0 ? "num warn" : "num");
    body.appendChild(row);
  }
}

// Running rollouts, and those that ended within the last ROLLOUTS_ENDED_SHOWN_MS.
const ROLLOUTS_ENDED_SHOWN_MS = 3600000;

function renderRollouts(rollouts) {
  const now = Date.now();
  const shown = (rollouts || []).filter((r) =>
    r.state === "running" || now - (r.ended_at_ms ?? 0) < ROLLOUTS_ENDED_SHOWN_MS);
  $("rollouts-card").hidden = shown.length === 0;
  const body = $("rollouts").tBodies[0];
  body.replaceChildren();
  for (const rollout of shown) {
    const row = document.createElement("tr");
    row.id = `rollout-${rollout.id}`;
    cell(row, `${rollout.id}: ${rollout.kind} v${rollout.baseline_version} → v${rollout.version}`);
    const state = rollout.state.replace("_", " ");
    cell(row, state, rollout.state === "rolled_back" ? "bad" : rollout.state === "running" ? "warn" : "ok")
      .classList.add("rollout-state");
    cell(row, `${rollout.history.length} of ${rollout.steps.length - 1}`, "num");
    cell(row, `${rollout.share_percent} %`, "num");
    cell(row, rollout.guards.join("; ") || "none");
    const last = rollout.history[rollout.history.length - 1];
    cell(row, rollout.reason ?? (last && last.judged.length ? last.judged.join("; ") : "–"));
    body.appendChild(row);
  }
}

// A report reads the experiment's task records: fetched now and then, not every poll.
const REPORTS_EVERY_MS = 30000;
let reportsFetchedAt = -Infinity;

function renderExperiments(reports) {
  $("experiments-card").hidden = reports.length === 0;
  const body = $("experiments").tBodies[0];
  body.replaceChildren();
  const verdicts = $("experiment-verdicts");
  verdicts.replaceChildren();
  for (const report of reports) {
    const experiment = report.experiment;
    for (const variant of report.variants) {
      const row = document.createElement("tr");
      cell(row, `${experiment.id}: ${experiment.kind} (${experiment.mode}, by ${experiment.assign_by})`);
      cell(row, variant.name);
      cell(row, String(variant.version), "num");
      cell(row, String(variant.tasks), "num").id = `experiment-${experiment.id}-${variant.name}-tasks`;
      cell(row, String(variant.completed), "num");
      const p99 = BUCKETS.map((b) => variant.wait_ms?.[b]?.claimed ? duration(variant.wait_ms[b].p99_ms) : "–");
      cell(row, p99.join(" / "), "num");
      const runtime = variant.runtime || {};
      cell(row, String(runtime.decisions_total ?? "–"), "num");
      cell(row, String(runtime.faults_total ?? "–"), runtime.faults_total > 0 ? "num warn" : "num");
      cell(row, experiment.mode === "shadow" ? String(runtime.disagreements_total ?? "–") : "–", "num");
      body.appendChild(row);
    }
    for (const comparison of report.comparisons || []) {
      const item = document.createElement("li");
      item.textContent = `experiment ${experiment.id}: ${comparison.verdict}`;
      verdicts.appendChild(item);
    }
  }
}

async function pollExperiments() {
  const now = Date.now();
  if (now - reportsFetchedAt < REPORTS_EVERY_MS) return;
  reportsFetchedAt = now;
  try {
    const all = await getJson("/v1/experiments");
    const running = all.filter((experiment) => experiment.ended_at_ms === undefined);
    renderExperiments(await Promise.all(running.map((e) => getJson(`/v1/experiments/${e.id}`))));
  } catch (error) {
    reportsFetchedAt = -Infinity;
    console.error("experiment reports failed:", error);
  }
}

function setHealth(label, className) {
  const pill = $("health");
  pill.textContent = label;
  pill.className = `pill ${className}`;
}

async function poll() {
  try {
    const [stats, workers, policies, ready, history, rollouts] = await Promise.all([
      getJson("/v1/stats"),
      getJson("/v1/workers"),
      unlessForbidden(getJson("/v1/policies")),
      fetch("/readyz", { headers: authHeaders() }).then((r) => r.ok),
      getJson("/v1/stats/history"),
      unlessForbidden(getJson("/v1/rollouts")),
    ]);
    renderStats(stats);
    renderHistory(history);
    renderWorkers(workers.workers);
    renderPolicies(policies && policies.policies);
    renderRollouts(rollouts);
    setHealth(ready ? "ready" : "draining", ready ? "ok" : "warn");
    text("updated", new Date().toLocaleTimeString());
    pollExperiments();
    return stats;
  } catch (error) {
    if (error.status !== 401) {
      setHealth("unreachable", "bad");
      console.error("status poll failed:", error);
    }
    return null;
  }
}

// One event as a line; the task id is left out where the list is one task's timeline.
function eventLine(event, withTask = true) {
  const from = event.from ?? "new";
  const detail = event.detail ? ` — ${event.detail}` : "";
  const at = new Date(event.at_ms).toLocaleTimeString();
  const task = withTask ? ` ${event.task_id}` : "";
  return `#${event.seq} ${at}${task} ${from} → ${event.to} by ${event.actor}${detail}`;
}

function setStream(label, className) {
  $("stream-state").textContent = label;
  $("stream-state").className = `pill ${className}`;
}

function showEvent(event) {
  const list = $("events");
  const item = document.createElement("li");
  item.textContent = eventLine(event);
  item.dataset.seq = String(event.seq);
  item.addEventListener("click", () => lookup(event.task_id));
  list.prepend(item);
  while (list.children.length > MAX_EVENTS_SHOWN) list.lastElementChild.remove();
}

// One Server-Sent Events message: its `event` name and its `data`.
function parseMessage(block) {
  const message = { event: "message", data: "" };
  for (const line of block.split("\n")) {
    const colon = line.indexOf(":");
    if (colon <= 0) continue;
    const field = line.slice(0, colon);
    const value = line.slice(colon + 1).replace(/^ /, "");
    if (field === "event") message.event = value;
    if (field === "data") message.data += value;
  }
  return message;
}

// Follows the event log as Server-Sent Events, read with fetch rather than EventSource so the
// token goes in a header (never in the URL, where logs would keep it). Reconnects from the
// last event seen.
let following = null;
async function followEvents(afterSeq) {
  if (following) following.abort();
  const controller = new AbortController();
  following = controller;
  let after = afterSeq;
  while (!controller.signal.aborted) {
    try {
      const response = await fetch(`/v1/events?after=${after}`, {
        headers: { accept: "text/event-stream", ...authHeaders() },
        signal: controller.signal,
      });
      if (response.status === 401) {
        setStream("off", "");
        if (following === controller) following = null;
        return;
      }
      if (!response.ok || !response.body) throw new Error(`HTTP ${response.status}`);
      setStream("live", "ok");
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value.replace(/\r\n/g, "\n");
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const message = parseMessage(buffer.slice(0, end));
          buffer = buffer.slice(end + 2);
          if (message.event !== "transition" || !message.data) continue;
          const event = JSON.parse(message.data);
          after = Math.max(after, event.seq);
          showEvent(event);
        }
      }
    } catch (error) {
      if (controller.signal.aborted) return;
    }
    setStream("reconnecting", "warn");
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
}

async function lookup(id) {
  id = id.trim();
  $("lookup-id").value = id;
  const error = $("lookup-error");
  const result = $("lookup-result");
  error.hidden = true;
  if (!id) return;
  try {
    const encoded = encodeURIComponent(id);
    const [task, events] = await Promise.all([
      getJson(`/v1/tasks/${encoded}`),
      getJson(`/v1/tasks/${encoded}/events`),
    ]);
    const summary = $("task-summary");
    summary.replaceChildren();
    const fields = [["id", task.id], ["kind", task.kind], ["state", task.state],
      ["bucket", `${task.bucket} (submitted ${task.priority})`], ["attempt", `${task.attempt} of ${task.max_attempts}`],
      ["device", task.device]];
    if (task.lease) fields.push(["worker", task.lease.worker]);
    if (task.error) fields.push(["error", `${task.error.class}: ${task.error.message}`]);
    for (const [name, value] of fields) {
      const dt = document.createElement("dt");
      dt.textContent = name;
      const dd = document.createElement("dd");
      dd.textContent = value;
      summary.append(dt, dd);
    }
    const timeline = $("timeline");
    timeline.replaceChildren();
    for (const event of events.events) {
      const item = document.createElement("li");
      item.textContent = eventLine(event, false);
      item.dataset.to = event.to;
      timeline.appendChild(item);
    }
    result.hidden = false;
  } catch (failure) {
    result.hidden = true;
    error.textContent = failure.message;
    error.hidden = false;
  }
}

// Polls, and follows the log once a poll succeeds (with a token, when one is needed).
async function begin() {
  const stats = await poll();
  if (!stats) return;
  const last = stats.last_event_seq || 0;
  followEvents(Math.max(0, last - MAX_EVENTS_SHOWN));
}

async function start() {
  $("lookup").addEventListener("submit", (submit) => {
    submit.preventDefault();
    lookup($("lookup-id").value);
  });
  $("token-form").addEventListener("submit", (submit) => {
    submit.preventDefault();
    const token = $("token-input").value.trim();
    if (!token) return;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("token-input").value = "";
    $("token-form").hidden = true;
    begin();
  });
  await begin();
  setInterval(async () => {
    const stats = await poll();
    if (stats && !following) begin();
  }, POLL_MS);
}

start();
