"""`Worker` against a real server: many tasks through worker processes, one of them killed;
a cancel reaching a running executor (sync and asyncio); SIGTERM draining a worker."""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time
from collections import Counter

import httpx

from conftest import HERE, wait_for

from sluice_client import Client, Job, TaskRequest, Worker


def test_500_tasks_through_3_workers_one_killed_each_completed_exactly_once(
    client, server, processes
):
    workers = [
        processes(
            HERE / "worker_proc.py",
            ["--server", server.url, "--id", f"py-{n}", "--gpus", "2", "--exec-ms", "30",
             "--fail-percent", "10"],
            f"py-{n}",
        )
        for n in range(3)
    ]
    requests = [
        TaskRequest(kind="oct.analyze", key=f"exam-{n}", max_attempts=20, est_exec_ms=30,
                    payload={"exam": n})
        for n in range(500)
    ]
    ids = []
    for start in range(0, 500, 250):
        answers = client.submit_batch(requests[start : start + 250])
        ids += [a.id for a in answers]
    assert len(set(ids)) == 500

    def completed() -> int:
        return client.stats()["tasks_by_state"].get("completed", 0)

    # Mid-run: the first worker dies holding leases, which expire and are retried.
    wait_for("a third of the tasks completed", lambda: completed() >= 150, timeout_s=120)
    workers[0].kill9()
    wait_for("every task completed", lambda: completed() == 500, timeout_s=180, pause_s=0.2)

    tasks = list(client.iter_tasks(limit=1000))
    assert len(tasks) == 500
    assert Counter(t.state for t in tasks) == {"completed": 500}
    retried = 0
    for task in tasks:
        events = client.task_events(task.id)
        into_completed = [e for e in events if e.to_state == "completed"]
        assert len(into_completed) == 1, f"{task.id} completed {len(into_completed)} times"
        assert task.result["attempt"] == task.attempt
        retried += task.attempt > 1
    # 10 % of attempts fail and the killed worker's leases expired: some tasks ran again.
    assert retried >= 20, retried
    for survivor in workers[1:]:
        assert survivor.terminate() == 0
        assert "drained:" in survivor.output()


def slow_worker(client: Client, worker_id: str, executor, **options) -> tuple[Worker, threading.Thread]:
    worker = Worker(client, worker_id, executor, gpus=1, claim_wait_ms=500, **options)
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False}, daemon=True)
    thread.start()
    return worker, thread


def worker_view(client: Client, worker_id: str) -> dict:
    return next(w for w in client.workers() if w["id"] == worker_id)


def test_a_cancel_reaches_the_running_executor_within_a_lease_heartbeat(client):
    seen: dict[str, float] = {}
    running = threading.Event()

    def execute(job: Job) -> dict:
        running.set()
        if job.cancelled.wait(timeout=60):
            seen[job.task.id] = time.monotonic()
            return {}
        return {"finished": True}

    worker, thread = slow_worker(client, "py-cancel", execute)
    task = client.submit("oct.analyze", {"exam": 1})
    wait_for("the executor running", running.is_set)
    client.wait(task.id, states={"running"}, timeout_s=30)
    cancelled_at = time.monotonic()
    client.cancel(task.id)
    wait_for("the executor to see the cancel", lambda: task.id in seen, timeout_s=10)
    # Lease heartbeats go every third of the 2 s lease.
    assert seen[task.id] - cancelled_at <= 2.0, seen[task.id] - cancelled_at
    ended = client.get(task.id)
    assert ended.state == "cancelled"
    # The worker reported `stopped`, which frees its GPU on the server.
    wait_for("the lease marked stopped", lambda: client.get(task.id).lease.stopped_at_ms)
    wait_for("the GPU free again", lambda: worker_view(client, "py-cancel")["leases"] == 0
                          and worker_view(client, "py-cancel")["free_gpus"] == 1)
    # And the freed GPU runs the next task.
    running.clear()
    follow = client.submit("oct.analyze", {"exam": 2})
    wait_for("the next task running", running.is_set)
    client.cancel(follow.id)
    worker.stop()
    thread.join(30)
    assert not thread.is_alive()
    assert worker.stats.stopped == 2


def test_an_asyncio_executor_is_cancelled_by_the_server(client):
    outcome: dict[str, str] = {}
    running = threading.Event()

    async def execute(job: Job) -> dict:
        running.set()
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            outcome[job.task.id] = "cancelled"
            raise
        return {}

    worker, thread = slow_worker(client, "py-async", execute)
    task = client.submit("oct.analyze", {"exam": 1})
    wait_for("the coroutine running", running.is_set)
    client.wait(task.id, states={"running"}, timeout_s=30)
    client.cancel(task.id)
    wait_for("the coroutine cancelled", lambda: outcome.get(task.id), timeout_s=10)
    wait_for("the lease marked stopped", lambda: client.get(task.id).lease.stopped_at_ms)
    worker.stop()
    thread.join(30)
    assert worker.stats.stopped == 1


def test_sigterm_drains_a_worker_process(client, server, processes):
    proc = processes(
        HERE / "worker_proc.py",
        ["--server", server.url, "--id", "py-drain", "--gpus", "2", "--exec-ms", "1500"],
        "py-drain",
    )
    held = [client.submit("oct.analyze", {"exam": n}) for n in range(2)]
    for task in held:
        client.wait(task.id, states={"running"}, timeout_s=60)
    proc.process.send_signal(signal.SIGTERM)
    # Submitted while the worker drains: it must not be claimed.
    later = client.submit("oct.analyze", {"exam": 3})
    assert proc.process.wait(timeout=30) == 0
    # What it held finished and was reported; it claimed nothing after the signal.
    for task in held:
        assert client.get(task.id).state == "completed"
    assert client.get(later.id).state == "queued"
    line = re.search(r"drained: claimed (\d+) completed (\d+)", proc.output())
    assert line and line.groups() == ("2", "2"), proc.output()


class FlakyTransport(httpx.HTTPTransport):
    """The real transport, but the first `failures` reports of `report` never reach the
    server (a dropped connection), the next `lost` reach it and lose their answer, and the next
    `errors_5xx` are answered 503 by a "proxy"."""

    def __init__(self, report: str, failures: int, lost: int, errors_5xx: int):
        super().__init__()
        self.report, self.failures, self.lost, self.errors_5xx = report, failures, lost, errors_5xx
        self.dropped = 0
        self.answers_lost = 0
        self.answered_503 = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith(f"/{self.report}"):
            if self.dropped < self.failures:
                self.dropped += 1
                raise httpx.ConnectError("simulated: connection refused", request=request)
            if self.answers_lost < self.lost:
                self.answers_lost += 1
                super().handle_request(request).read()
                raise httpx.ReadError("simulated: connection reset", request=request)
            if self.answered_503 < self.errors_5xx:
                self.answered_503 += 1
                return httpx.Response(503, json={"type": "urn:sluice:problem:overloaded",
                                                 "title": "Overloaded", "status": 503})
        return super().handle_request(request)


def test_reports_are_retried_through_network_errors_and_5xx_while_the_lease_lasts(server):
    flaky = FlakyTransport("complete", failures=2, lost=1, errors_5xx=2)
    device = Client(server.url)
    worker, thread = slow_worker(Client(server.url, transport=flaky), "py-flaky",
                                 lambda job: {"exam": job.payload["exam"]})
    task = device.submit("oct.analyze", {"exam": 5})
    done = device.wait(task.id, timeout_s=30)
    assert (done.state, done.result, done.attempt) == ("completed", {"exam": 5}, 1)
    # The server has it once the answer-lost report lands; the worker's resends go on.
    wait_for("the worker's report answered", lambda: worker.stats.completed == 1)
    assert (flaky.dropped, flaky.answers_lost, flaky.answered_503) == (2, 1, 2)
    # The report whose answer was lost had landed; its resends were answered as it was.
    completions = [e for e in device.task_events(task.id) if e.to_state == "completed"]
    assert len(completions) == 1
    worker.stop()
    thread.join(30)
    assert (worker.stats.completed, worker.stats.errors) == (1, 5)
    device.close()


def test_loaded_models_are_announced_at_once(client):
    def execute(job: Job) -> dict:
        job.worker.loaded("retina-net", gpu=job.gpu or 0, memory_mb=2048)
        return {}

    worker, thread = slow_worker(client, "py-models", execute, heartbeat_interval_s=60)
    task = client.submit("oct.analyze")
    client.wait(task.id, timeout_s=30)
    # The heartbeat interval is a minute: only the announcement can have sent it.
    wait_for("the model announced", lambda: worker_view(client, "py-models").get("loaded_models"))
    assert worker_view(client, "py-models")["loaded_models"] == [
        {"name": "retina-net", "gpu": 0, "memory_mb": 2048}]
    worker.unloaded("retina-net")
    wait_for("the model gone", lambda: not worker_view(client, "py-models").get("loaded_models"))
    worker.stop()
    thread.join(30)


def test_a_result_over_the_servers_bound_fails_the_task_for_good(client):
    worker, thread = slow_worker(client, "py-big", lambda job: {"blob": "x" * 2_000_000})
    task = client.submit("oct.analyze", max_attempts=3)
    ended = client.wait(task.id, timeout_s=30)
    assert (ended.state, ended.attempt) == ("dead", 1), ended
    assert "max_result_bytes" in ended.error["message"]
    worker.stop()
    thread.join(30)
    assert worker.stats.failed == 1


def test_heartbeats_go_on_while_a_stopped_worker_drains(client):
    release = threading.Event()
    running = threading.Event()

    def execute(job: Job) -> dict:
        running.set()
        release.wait(30)
        return {"drained": True}

    worker, thread = slow_worker(client, "py-draining", execute, heartbeat_interval_s=0.2)
    task = client.submit("oct.analyze")
    wait_for("the executor running", running.is_set)
    worker.stop()
    stopped_at = time.monotonic()
    # A heartbeat sent well after the stop: the server still sees a live worker.
    wait_for("a heartbeat during the drain", lambda: time.monotonic() - stopped_at > 1.0
             and worker_view(client, "py-draining")["heartbeat_age_ms"] < 500, timeout_s=10)
    release.set()
    thread.join(30)
    assert not thread.is_alive()
    assert client.get(task.id).result == {"drained": True}
