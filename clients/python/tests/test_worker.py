"""`Worker` against a real server: many tasks through worker processes, one of them killed;
a cancel reaching a running executor (sync and asyncio); SIGTERM draining a worker."""

from __future__ import annotations

import asyncio
import re
import signal
import threading
import time
from collections import Counter

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
