"""`Client` against a real server: devices' calls, errors as exceptions with the problem's
type, the event stream resumed, and operators' calls."""

from __future__ import annotations

import itertools

import pytest
from conftest import REPOSITORY

from sluice_client import Client, ProblemError, TaskRequest, TransportError

ROOT = "root-token-of-the-python-client-tests"


def test_submission_is_idempotent_by_key_and_batches_answer_in_order(client):
    first = client.submit("oct.analyze", {"exam": 7}, key="site-a/exam-7", priority="urgent",
                          labels={"ed": "true"}, device="scanner-1", tenant="site-a")
    again = client.submit("oct.analyze", {"exam": 7}, key="site-a/exam-7", priority="urgent",
                          labels={"ed": "true"}, device="scanner-1", tenant="site-a")
    assert again.id == first.id
    assert (first.kind, first.priority, first.labels, first.device) == (
        "oct.analyze", "urgent", {"ed": "true"}, "scanner-1")
    with pytest.raises(ProblemError) as conflict:
        client.submit("oct.analyze", {"exam": 8}, key="site-a/exam-7")
    assert (conflict.value.status, conflict.value.type) == (409, "idempotency-conflict")

    answers = client.submit_batch([
        TaskRequest(kind="oct.analyze", payload={"n": 1}),
        {"kind": "oct.analyze", "max_attempts": 0},
        TaskRequest(kind="ct.scan", priority="low"),
    ])
    assert [type(a).__name__ for a in answers] == ["Task", "ProblemError", "Task"]
    assert answers[1].type == "invalid-task"
    assert answers[2].bucket == "low"
    assert client.get(answers[0].id).payload == {"n": 1}


def test_errors_carry_the_problem_type(client, server):
    with pytest.raises(ProblemError) as missing:
        client.get("01ARZ3NDEKTSV4RRFFQ69G5FAV")
    assert (missing.value.status, missing.value.type) == (404, "task-not-found")
    with pytest.raises(ProblemError) as bad:
        client.submit("")
    assert bad.value.status == 422 and bad.value.type == "invalid-task"
    with pytest.raises(ProblemError) as unknown:
        client.request("POST", "/v1/tasks", json_body={"kind": "x", "colour": "red"})
    assert unknown.value.type == "invalid-request" and "colour" in unknown.value.detail
    with Client("http://127.0.0.1:1", timeout_s=2) as nowhere, pytest.raises(TransportError):
        nowhere.get("01ARZ3NDEKTSV4RRFFQ69G5FAV")


def test_wait_cancel_and_list(client):
    task = client.submit("oct.analyze")
    assert client.wait(task.id, states={"queued"}, timeout_s=5).state == "queued"
    with pytest.raises(TimeoutError):
        client.wait(task.id, timeout_s=0.2)
    cancelled = client.cancel(task.id)
    assert cancelled.state == "cancelled" and cancelled.ended
    assert client.wait(task.id, timeout_s=5).state == "cancelled"
    with pytest.raises(ProblemError) as twice:
        client.cancel(task.id)
    assert twice.value.status == 409
    for n in range(5):
        client.submit("ct.scan", {"n": n})
    listed = list(client.iter_tasks(kind="ct.scan", limit=2))
    assert len(listed) == 5 and len({t.id for t in listed}) == 5
    assert all(t.kind == "ct.scan" for t in listed)


def test_the_event_stream_resumes_from_the_last_event_seen(client):
    tasks = [client.submit("oct.analyze", {"n": n}) for n in range(3)]
    stream = client.events(after=0)
    first = list(itertools.islice((e for e in stream if e.to_state == "queued"), 3))
    stream.close()
    assert [e.task_id for e in first] == [t.id for t in tasks]
    client.cancel(tasks[0].id)
    resumed = next(client.events(after=first[-1].seq))
    assert (resumed.task_id, resumed.from_state, resumed.to_state) == (
        tasks[0].id, "queued", "cancelled")
    assert resumed.seq > first[-1].seq


def test_operators_manage_policies_experiments_tokens_and_limits(client):
    fixture = REPOSITORY / "host/policy-runtime/fixtures/retry-backoff-built-at-3c4ae0e.wasm"
    uploaded = client.upload_policy("retry", fixture, config={"initial_delay_ms": 100})
    assert (uploaded.kind, uploaded.version, uploaded.created) == ("retry", 1, True)
    assert client.policy("retry")["active_version"] == 0
    client.activate_policy("retry", 1)
    assert client.policy("retry")["active_version"] == 1
    client.rollback_policy("retry")
    assert client.policy("retry")["active_version"] == 0

    experiment = client.start_experiment(
        "retry", [{"name": "now", "version": 0}, {"name": "new", "version": 1}])
    assert [e["id"] for e in client.experiments()] == [experiment["id"]]
    report = client.experiment_report(experiment["id"])
    assert [v["name"] for v in report["variants"]] == ["now", "new"]
    assert client.stop_experiment(experiment["id"])["end"]["outcome"] == "stopped"

    client.set_concurrency_limit("scanner-*", 2)
    limits = client.concurrency_limits()["limits"]
    assert {"key": "scanner-*", "limit": 2, "source": "api"} in limits
    client.remove_concurrency_limit("scanner-*")
    assert client.concurrency_limits()["limits"] == []



def test_tokens_bind_devices_and_revocation_ends_them(start_server):
    server = start_server(env={"SLUICE_ADMIN_TOKEN": ROOT})
    with Client(server.url) as anonymous, pytest.raises(ProblemError) as refused:
        anonymous.submit("oct.analyze")
    assert (refused.value.status, refused.value.type) == (401, "unauthorized")
    admin = Client(server.url, token=ROOT)
    issued = admin.issue_token("device", device="scanner-9", tenant="site-b")
    assert issued.token and issued.role == "device"
    with Client(server.url, token=issued.token) as device:
        task = device.submit("oct.analyze", device="someone-else")
        assert (task.device, task.tenant) == ("scanner-9", "site-b")
        with pytest.raises(ProblemError) as forbidden:
            device.issue_token("admin")
        assert forbidden.value.status == 403
    assert issued.id in [t["id"] for t in admin.tokens()]
    admin.revoke_token(issued.id)
    with Client(server.url, token=issued.token) as device, pytest.raises(ProblemError) as gone:
        device.submit("oct.analyze")
    assert (gone.value.status, gone.value.type) == (401, "unauthorized")
    admin.close()
