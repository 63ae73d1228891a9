// The status page: polls the JSON API the CLI uses and follows the event log live.
// Data is only ever written with textContent, never as HTML.
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

async function getJson(path) {
  const response = await fetch(path, { headers: { accept: "application/json" } });
  const body = await response.json().catch(() => null);
  if (!response.ok) {
    const detail = body && (body.detail || body.title);
    throw new Error(detail || `${path}: HTTP ${response.status}`);
  }
  return body;
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
  for (const policy of policies) {
    const row = document.createElement("tr");
    cell(row, policy.kind);
    cell(row, policy.active_version === 0 ? "0 (built-in)" : String(policy.active_version), "num");
    cell(row, String(policy.decisions_total), "num");
    cell(row, String(policy.faults_total), policy.faults_total > 0 ? "num warn" : "num");
    body.appendChild(row);
  }
}

function setHealth(label, className) {
  const pill = $("health");
  pill.textContent = label;
  pill.className = `pill ${className}`;
}

async function poll() {
  try {
    const [stats, workers, policies, ready] = await Promise.all([
      getJson("/v1/stats"),
      getJson("/v1/workers"),
      getJson("/v1/policies"),
      fetch("/readyz").then((r) => r.ok),
    ]);
    renderStats(stats);
    renderWorkers(workers.workers);
    renderPolicies(policies.policies);
    setHealth(ready ? "ready" : "draining", ready ? "ok" : "warn");
    text("updated", new Date().toLocaleTimeString());
    return stats;
  } catch (error) {
    setHealth("unreachable", "bad");
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

function followEvents(afterSeq) {
  const list = $("events");
  const source = new EventSource(`/v1/events?after=${afterSeq}`);
  source.onopen = () => { $("stream-state").textContent = "live"; $("stream-state").className = "pill ok"; };
  source.onerror = () => { $("stream-state").textContent = "reconnecting"; $("stream-state").className = "pill warn"; };
  source.addEventListener("transition", (message) => {
    const event = JSON.parse(message.data);
    const item = document.createElement("li");
    item.textContent = eventLine(event);
    item.dataset.seq = String(event.seq);
    item.addEventListener("click", () => lookup(event.task_id));
    list.prepend(item);
    while (list.children.length > MAX_EVENTS_SHOWN) list.lastElementChild.remove();
  });
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

async function start() {
  $("lookup").addEventListener("submit", (submit) => {
    submit.preventDefault();
    lookup($("lookup-id").value);
  });
  const stats = await poll();
  const last = stats ? stats.last_event_seq : 0;
  followEvents(Math.max(0, last - MAX_EVENTS_SHOWN));
  setInterval(poll, POLL_MS);
}

start();
