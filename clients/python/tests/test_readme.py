"""The README's Python worker, as printed there, run as a process against a real server: it
completes a task, fails one as transient until its attempts are spent, and drains on
SIGTERM."""

from __future__ import annotations

import re
import signal

from conftest import REPOSITORY


def readme_worker() -> str:
    readme = (REPOSITORY / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(blocks) == 1, "the README shows one Python worker"
    code = blocks[0]
    assert len(code.strip().splitlines()) <= 15, "the README's worker is at most 15 lines"
    return code


def test_the_readmes_worker_runs_as_printed(client, server, processes, tmp_path):
    code = readme_worker().replace("http://127.0.0.1:7700", server.url)
    script = tmp_path / "readme_worker.py"
    script.write_text(code)
    proc = processes(script, [], "readme-worker")
    good = client.submit("oct.analyze", {"exam": "4711"})
    done = client.wait(good.id, timeout_s=60)
    assert (done.state, done.result) == ("completed", {"exam": "4711", "finding": "none"})
    broken = client.submit("oct.analyze", {"exam": "broken"}, max_attempts=2)
    dead = client.wait(broken.id, timeout_s=60)
    assert (dead.state, dead.attempt) == ("dead", 2), dead
    assert dead.error["message"].startswith("GPU fault")
    assert client.get(good.id).lease.worker == "gpu-node-1"
    proc.process.send_signal(signal.SIGTERM)
    assert proc.process.wait(timeout=30) == 0, proc.output()
