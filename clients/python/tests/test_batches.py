"""GPU batches through `Worker(batch=...)` against a real server: an executor's
`execute_batch` gets tasks of one model and batch key at a time, no more than the batch size,
each task keeps its own report (one failed in a batch fails alone), and every task ends once."""

from __future__ import annotations

import threading
from collections import Counter

from conftest import wait_for

from sluice_client import Batch, Client, Job, PermanentError, TaskRequest, Worker


class Batcher:
    """Runs each batch as one call; fails the task whose payload asks to."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, str]]] = []
        self._lock = threading.Lock()

    def execute_batch(self, jobs: list[Job]) -> list:
        with self._lock:
            self.batches.append(
                [(job.task.resources["model"], job.task.resources["batch_key"]) for job in jobs]
            )
        answers: list = []
        for job in jobs:
            if job.payload.get("fail"):
                answers.append(PermanentError("this scan is unreadable"))
            else:
                answers.append({"batch": len(jobs), "n": job.payload["n"]})
        return answers


def test_a_batching_worker_runs_batches_of_one_model_and_shape(client: Client):
    requests = [
        TaskRequest(
            kind="oct.infer",
            priority=["urgent", "normal", "low"][n % 3],
            resources={"model": ["seg-v3", "denoise-v2"][n % 2], "batch_key": ["512", "1024"][n % 4 // 2]},
            payload={"n": n, "fail": n == 7},
            max_attempts=1,
        )
        for n in range(64)
    ]
    answers = client.submit_batch(requests)
    ids = [answer.id for answer in answers]
    batcher = Batcher()
    worker = Worker(
        client, "py-batcher", batcher, gpus=2, claim_wait_ms=500, batch=Batch(max_size=8, max_wait_ms=50)
    )
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False}, daemon=True)
    thread.start()

    def ended() -> int:
        states = client.stats()["tasks_by_state"]
        return states.get("completed", 0) + states.get("dead", 0)

    wait_for("every task ended", lambda: ended() == 64, timeout_s=60)
    worker.stop()
    thread.join(timeout=30)
    assert not thread.is_alive()

    assert sum(len(batch) for batch in batcher.batches) == 64
    assert all(len(batch) <= 8 for batch in batcher.batches)
    assert all(len(set(batch)) == 1 for batch in batcher.batches), batcher.batches
    assert max(len(batch) for batch in batcher.batches) > 1
    assert worker.stats.batches == len(batcher.batches)
    tasks = {task.id: task for task in client.iter_tasks(limit=1000)}
    assert Counter(task.state for task in tasks.values()) == {"completed": 63, "dead": 1}
    failed = tasks[ids[7]]
    assert failed.state == "dead"
    assert failed.error["class"] == "permanent"
    for n, task_id in enumerate(ids):
        if n != 7:
            assert tasks[task_id].result["n"] == n


def test_a_bad_batch_is_refused_before_any_claim():
    for bad, says in [
        ({"max_size": 0}, "1 to 64"),
        ({"max_size": 65}, "1 to 64"),
        ({"max_size": 8, "max_wait_ms": 10_001}, "0 to 10000"),
        ({"max_size": 8, "models": "seg-v3"}, "not one string"),
        ({"max_size": 8, "models": ("bad model",)}, "bad model"),
    ]:
        try:
            Batch(**bad)
        except ValueError as error:
            assert says in str(error), (bad, str(error))
        else:
            raise AssertionError(f"{bad} was accepted")
