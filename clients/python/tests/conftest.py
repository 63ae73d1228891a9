"""Fixtures: a real `sluice serve` on port 0 with a temporary data directory, and worker
processes of this package. The binary is `SLUICE_BIN`, or the repository's debug build."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from sluice_client import Client

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent
REPOSITORY = PACKAGE.parent.parent


def sluice_binary() -> str:
    configured = os.environ.get("SLUICE_BIN")
    if configured:
        return configured
    for profile in ("debug", "release"):
        built = REPOSITORY / "target" / profile / "sluice"
        if built.exists():
            return str(built)
    found = shutil.which("sluice")
    if found:
        return found
    pytest.fail("no sluice binary: build it (cargo build) or set SLUICE_BIN")


class Server:
    """A running `sluice serve`; `url` from its first line."""

    def __init__(self, data_dir: Path, args: Sequence[str] = (), env: dict[str, str] | None = None):
        self.log_path = data_dir.parent / f"{data_dir.name}.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [sluice_binary(), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir), *args],
            stdout=subprocess.PIPE,
            stderr=self._log,
            env={**os.environ, "SLUICE_LOG": "warn", **(env or {})},
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline().decode()
        if not line.startswith("listening on "):
            self.stop()
            raise RuntimeError(f"sluice serve did not start: {line!r}; log: {self.log()}")
        self.url = line.split()[2]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


#: Settings that make the tests quick: short leases (a killed worker's tasks come back in
#: seconds) and a retry backoff of milliseconds.
QUICK = [
    "--lease-ms",
    "2000",
    "--worker-stale-ms",
    "3000",
    "--policy-config",
    "retry.initial_delay_ms=50",
    "--policy-config",
    "retry.max_delay_ms=200",
]


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator:
    started: list[Server] = []

    def start(args: Sequence[str] = (), env: dict[str, str] | None = None, name: str = "data") -> Server:
        server = Server(tmp_path / name, [*QUICK, *args], env)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def server(start_server) -> Server:
    return start_server()


@pytest.fixture
def client(server: Server) -> Iterator[Client]:
    with Client(server.url) as c:
        yield c


class Process:
    """A Python script of this suite (or an example) run as its own process."""

    def __init__(self, script: Path, args: Sequence[str], log: Path):
        self.log_path = log
        self._log = open(log, "wb")
        self.process = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill9(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def terminate(self, timeout_s: float = 60) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout_s)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()


@pytest.fixture
def processes(tmp_path: Path) -> Iterator:
    started: list[Process] = []

    def start(script: Path, args: Sequence[str], name: str) -> Process:
        proc = Process(script, args, tmp_path / f"{name}.out")
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.close()


def wait_for(what: str, check, timeout_s: float = 60.0, pause_s: float = 0.05):
    """Polls `check` until it returns something truthy; fails naming `what` after the limit."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(pause_s)
