"""The examples as processes against a real server: Python shard workers over 4 shards answer
the brute-force top-10 (and the Rust shard workers' answers) for every query; the OCT worker's
results are its pipeline's."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
from conftest import PACKAGE, sluice_binary

from sluice_client import TaskRequest

EXAMPLES = PACKAGE / "examples"
sys.path.insert(0, str(EXAMPLES))

import oct_worker  # noqa: E402


def live_shards(client, collection: str) -> int:
    for c in client.request("GET", "/v1/collections")["collections"]:
        if c["name"] == collection:
            return c["live_shards"]
    return 0


def test_python_shard_workers_answer_the_exact_top_10(client, server, processes, tmp_path):
    from conftest import wait_for

    rng = np.random.default_rng(47)
    base = rng.normal(size=(4000, 32)).astype(np.float32)
    path = tmp_path / "base.npy"
    np.save(path, base)
    for shard in range(4):
        processes(EXAMPLES / "shard_worker.py",
                  ["--server", server.url, "--vectors", str(path), "--collection", "py",
                   "--shard", f"{shard}/4"], f"py-shard-{shard}")
    rust = [
        subprocess.Popen([sluice_binary(), "worker", "--server", server.url, "--id",
                          f"rs-shard-{shard}", "--vectors", str(path), "--collection", "rs",
                          "--shard", f"{shard}/4"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for shard in range(4)
    ]
    try:
        wait_for("4 live Python shards", lambda: live_shards(client, "py") == 4)
        wait_for("4 live Rust shards", lambda: live_shards(client, "rs") == 4)
        queries = rng.normal(size=(20, 32)).astype(np.float32)
        answers = {}
        for collection in ("py", "rs"):
            submitted = client.submit_batch([
                TaskRequest(kind="vector.search",
                            payload={"collection": collection, "vector": q.tolist(), "k": 10})
                for q in queries
            ])
            answers[collection] = [client.wait(t.id, timeout_s=60) for t in submitted]
        for n, query in enumerate(queries):
            exact = np.argsort(((base.astype(np.float64) - query) ** 2).sum(axis=1))[:10]
            py, rs = answers["py"][n], answers["rs"][n]
            assert py.state == "completed" and py.result["coverage"] == 1.0
            assert not py.result["partial"]
            py_ids = [h["id"] for h in py.result["hits"]]
            assert py_ids == exact.tolist(), n
            assert py_ids == [h["id"] for h in rs.result["hits"]]
    finally:
        for proc in rust:
            proc.kill()
            proc.wait()


def test_the_oct_worker_returns_its_pipelines_measurements(client, server, processes):
    processes(EXAMPLES / "oct_worker.py", ["--server", server.url, "--gpus", "2"], "py-oct")
    payloads = [{"exam": f"e{n}", "size": 128, "seed": n, "noise": 0.15} for n in range(6)]
    tasks = [client.submit("oct.analyze", p) for p in payloads]
    for task, payload in zip(tasks, payloads):
        done = client.wait(task.id, timeout_s=60)
        assert done.state == "completed"
        assert done.result == oct_worker.analyze(payload)
        assert 0.1 < done.result["foreground_fraction"] < 0.3
    bad = client.submit("oct.analyze", {"size": 5}, max_attempts=3)
    failed = client.wait(bad.id, timeout_s=60)
    # invalid-input: no retry can fix it, so the first attempt is the last.
    assert (failed.state, failed.attempt) == ("dead", 1), failed
    assert "16 to 1024" in failed.error["message"]
