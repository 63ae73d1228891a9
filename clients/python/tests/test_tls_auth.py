"""https with a private CA and auth on: a worker with its own worker token runs a device's
task; a worker token used for another worker is refused and ends the worker with the error;
without the CA file the certificate is not trusted."""

from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from sluice_client import Client, ProblemError, TransportError, Worker

ROOT = "root-token-of-the-tls-test"


def make_ca_and_server_cert(folder: Path) -> tuple[Path, Path, Path]:
    """A CA, and a certificate it signs for 127.0.0.1 and localhost (openssl)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("openssl is needed to make the test's certificates")
    ca_key, ca_cert = folder / "ca.key", folder / "ca.pem"
    key, csr, cert = folder / "server.key", folder / "server.csr", folder / "server.pem"
    ext = folder / "san.ext"
    ext.write_text("subjectAltName = IP:127.0.0.1, DNS:localhost\n")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out",
        str(ca_cert), "-days", "2", "-subj", "/CN=sluice test CA")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca_cert), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))
    return ca_cert, cert, key


def test_a_worker_token_over_tls_with_a_ca_file(start_server, tmp_path):
    ca, cert, key = make_ca_and_server_cert(tmp_path)
    server = start_server(["--tls-cert", str(cert), "--tls-key", str(key)],
                          env={"SLUICE_ADMIN_TOKEN": ROOT})
    assert server.url.startswith("https://")

    with Client(server.url, token=ROOT, timeout_s=5) as untrusting, pytest.raises(TransportError):
        untrusting.stats()

    admin = Client(server.url, token=ROOT, ca_file=ca)
    worker_token = admin.issue_token("worker", worker="gpu-a").token
    device_token = admin.issue_token("device", device="scanner-1", tenant="site-a").token
    device = Client(server.url, token=device_token, ca_file=ca)
    task = device.submit("oct.analyze", {"exam": 1})

    ran = []
    worker = Worker(Client(server.url, token=worker_token, ca_file=ca), "gpu-a",
                    lambda job: ran.append(job.task.id) or {"ok": True}, claim_wait_ms=500)
    thread = threading.Thread(target=worker.run, kwargs={"handle_signals": False}, daemon=True)
    thread.start()
    done = device.wait(task.id, timeout_s=30)
    assert (done.state, done.result) == ("completed", {"ok": True})
    assert ran == [task.id]
    worker.stop()
    thread.join(30)
    assert not thread.is_alive()

    # The same token for another worker's id: its first heartbeat is refused.
    impostor = Worker(Client(server.url, token=worker_token, ca_file=ca), "gpu-b",
                      lambda job: {}, claim_wait_ms=500)
    with pytest.raises(ProblemError) as refused:
        impostor.run(handle_signals=False)
    assert refused.value.status == 403 and refused.value.type == "forbidden"
    for c in (admin, device):
        c.close()
