"""`Client`: the HTTP API for devices (submit, wait, cancel, events), for workers' raw calls
(heartbeat, claim, report; `Worker` runs them for you) and for operators (policies,
experiments, rollouts, tokens, concurrency limits). Synchronous and thread-safe: one client may
serve a worker's threads.
"""

from __future__ import annotations

import json
import ssl
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx

from .errors import ProblemError, TransportError
from .types import (
    ClaimResponse,
    Event,
    Heartbeat,
    IssuedToken,
    Json,
    PolicyVersion,
    Task,
    TaskRequest,
)

DEFAULT_URL = "http://127.0.0.1:7700"
#: The most tasks one `submit_batch` request carries (the server's bound).
MAX_BATCH = 1000


class Client:
    """A connection pool to one Sluice server.

    `token`: the bearer token once auth is on. `ca_file`: a PEM file of the CA that signed the
    server's certificate, for https with a private CA. `timeout_s`: the longest one request may
    take (a claim's long poll adds its own wait to it).
    """

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        token: str | None = None,
        ca_file: str | Path | None = None,
        timeout_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ):
        headers = {"User-Agent": "sluice-client-python/0.1"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        verify: ssl.SSLContext | bool = True
        if ca_file is not None:
            verify = ssl.create_default_context(cafile=str(ca_file))
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self._http = httpx.Client(
            base_url=self.url,
            headers=headers,
            verify=verify,
            timeout=timeout_s,
            transport=transport,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # --- the transport -------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Mapping[str, Any] | None = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """One request; its JSON answer, or `ProblemError` / `TransportError`."""
        if params is not None:
            params = {k: v for k, v in params.items() if v is not None}
        try:
            response = self._http.request(
                method,
                path,
                json=json_body,
                params=params,
                content=content,
                headers=headers,
                timeout=timeout_s if timeout_s is not None else self.timeout_s,
            )
        except httpx.HTTPError as error:
            raise TransportError(f"{method} {self.url}{path}: {error!r}") from error
        if response.status_code >= 400:
            raise _problem(response)
        if response.status_code == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError as error:
            raise TransportError(f"{method} {path}: the answer is not JSON") from error

    # --- devices -------------------------------------------------------------------------

    def submit(self, kind: str, payload: Json = None, **fields: Any) -> Task:
        """Submits one task; with `key=`, idempotently (a resend gets the same task back).

        `fields` are those of `TaskRequest`: key, priority, device, tenant, labels,
        est_exec_ms, deadline_ms, max_attempts, callback_url, resources, preemptible,
        concurrency_key.
        """
        return self.submit_request(TaskRequest(kind=kind, payload=payload, **fields))

    def submit_request(self, request: TaskRequest) -> Task:
        return Task.from_json(self.request("POST", "/v1/tasks", json_body=request.to_json()))

    def submit_batch(
        self, requests: Iterable[TaskRequest | Mapping[str, Any]]
    ) -> list[Task | ProblemError]:
        """Submits up to `MAX_BATCH` tasks in one request, one durable write: each answer in
        order, the task or the problem that refused it."""
        bodies = [r.to_json() if isinstance(r, TaskRequest) else dict(r) for r in requests]
        if len(bodies) > MAX_BATCH:
            raise ValueError(f"a batch holds at most {MAX_BATCH} tasks, not {len(bodies)}")
        answer = self.request("POST", "/v1/tasks:batch", json_body={"tasks": bodies})
        out: list[Task | ProblemError] = []
        for item in answer["results"]:
            if "task" in item:
                out.append(Task.from_json(item["task"]))
            else:
                problem = item.get("problem", {})
                out.append(ProblemError(int(item.get("status", problem.get("status", 0))), problem))
        return out

    def get(self, task_id: str) -> Task:
        return Task.from_json(self.request("GET", f"/v1/tasks/{task_id}"))

    def list_tasks(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        device: str | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> tuple[list[Task], str | None]:
        """One page, in arrival order, and the `after` of the next (None at the end)."""
        params = {"state": state, "kind": kind, "device": device, "limit": limit, "after": after}
        answer = self.request("GET", "/v1/tasks", params=params)
        return [Task.from_json(t) for t in answer["tasks"]], answer.get("next_after")

    def iter_tasks(self, **filters: Any) -> Iterator[Task]:
        """Every task the filters select, page by page."""
        after = filters.pop("after", None)
        while True:
            page, after = self.list_tasks(after=after, **filters)
            yield from page
            if after is None:
                return

    def wait(
        self,
        task_id: str,
        *,
        states: Iterable[str] = Task.TERMINAL,
        timeout_s: float | None = None,
        poll_s: float = 1.0,
    ) -> Task:
        """Waits until the task is in one of `states` (by default: it has ended) and returns
        it; `TimeoutError` once `timeout_s` has passed. Polls, from 20 ms up to `poll_s`."""
        wanted = frozenset(states)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        pause = 0.02
        while True:
            task = self.get(task_id)
            if task.state in wanted:
                return task
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"task {task_id} is still {task.state} after {timeout_s} s")
                pause = min(pause, left)
            time.sleep(pause)
            pause = min(pause * 2, poll_s)

    def cancel(self, task_id: str) -> Task:
        return Task.from_json(self.request("POST", f"/v1/tasks/{task_id}/cancel"))

    def task_events(self, task_id: str, *, after: int | None = None) -> list[Event]:
        answer = self.request("GET", f"/v1/tasks/{task_id}/events", params={"after": after})
        return [Event.from_json(e) for e in answer["events"]]

    def events(self, *, after: int | None = None, reconnect: bool = True) -> Iterator[Event]:
        """The global event log from `after` on, as the server streams it (SSE), for as long as
        the caller reads. A dropped stream is resumed where it broke (`Last-Event-ID`) when
        `reconnect` is set."""
        last = after
        pause = 0.1
        while True:
            headers = {"Accept": "text/event-stream"}
            if last is not None:
                headers["Last-Event-ID"] = str(last)
            try:
                with self._http.stream(
                    "GET", "/v1/events", headers=headers, timeout=httpx.Timeout(None, connect=10)
                ) as response:
                    if response.status_code >= 400:
                        response.read()
                        raise _problem(response)
                    pause = 0.1
                    for event in _sse(response.iter_lines()):
                        last = event.seq
                        yield event
            except (httpx.TransportError, httpx.RemoteProtocolError) as error:
                if not reconnect:
                    raise TransportError(f"the event stream broke: {error!r}") from error
            if not reconnect:
                return
            time.sleep(pause)
            pause = min(pause * 2, 5.0)

    # --- workers' raw calls (see `Worker`) -----------------------------------------------

    def heartbeat(self, worker_id: str, heartbeat: Heartbeat) -> dict[str, Any]:
        return self.request(
            "POST", f"/v1/workers/{worker_id}/heartbeat", json_body=heartbeat.to_json()
        )

    def claim(
        self,
        worker_id: str,
        *,
        max_tasks: int,
        wait_ms: int,
        claim_id: str | None = None,
        batch: dict[str, Any] | None = None,
    ) -> ClaimResponse:
        """`batch` (`{"max_size": 8, "max_wait_ms": 20, "models": [...]}`) claims one GPU
        batch: tasks of one kind, model and batch key, on one GPU."""
        body: dict[str, Any] = {"max": max_tasks, "wait_ms": wait_ms}
        if claim_id is not None:
            body["claim_id"] = claim_id
        if batch is not None:
            body["batch"] = batch
        answer = self.request(
            "POST",
            f"/v1/workers/{worker_id}/claim",
            json_body=body,
            timeout_s=self.timeout_s + wait_ms / 1000,
        )
        return ClaimResponse.from_json(answer)

    def report(self, task_id: str, report: str, lease_token: str, **body: Any) -> Task:
        """`report`: start, heartbeat, complete (`result=`), fail (`class_=`, `message=`) or
        stopped."""
        if "class_" in body:
            body["class"] = body.pop("class_")
        body["lease_token"] = lease_token
        return Task.from_json(
            self.request("POST", f"/v1/tasks/{task_id}/{report}", json_body=body)
        )

    def workers(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/workers")["workers"]

    def stats(self) -> dict[str, Any]:
        return self.request("GET", "/v1/stats")

    # --- operators -----------------------------------------------------------------------

    def upload_policy(
        self,
        kind: str,
        component: bytes | str | Path,
        *,
        config: Mapping[str, Any] | str | None = None,
        memory_limit_bytes: int | None = None,
        call_fuel: int | None = None,
    ) -> PolicyVersion:
        """Stores a component (bytes, or a path to a `.wasm`) as the kind's next version, not
        active yet. `config`: its settings (`{"name": value}`, or `name=value` lines)."""
        if isinstance(component, (str, Path)):
            component = Path(component).read_bytes()
        if isinstance(config, Mapping):
            config = "\n".join(f"{k}={_setting(v)}" for k, v in config.items())
        params = {
            "config": config,
            "memory_limit_bytes": memory_limit_bytes,
            "call_fuel": call_fuel,
        }
        answer = self.request(
            "PUT",
            f"/v1/policies/{kind}",
            params=params,
            content=component,
            headers={"Content-Type": "application/wasm"},
            timeout_s=max(self.timeout_s, 300.0),
        )
        return PolicyVersion.from_json(answer)

    def activate_policy(self, kind: str, version: int) -> dict[str, Any]:
        return self.request(
            "POST", f"/v1/policies/{kind}/activate", json_body={"version": version}
        )

    def rollback_policy(self, kind: str) -> dict[str, Any]:
        return self.request("POST", f"/v1/policies/{kind}/rollback")

    def policies(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/policies")["policies"]

    def policy(self, kind: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/policies/{kind}")

    def start_experiment(
        self,
        kind: str,
        variants: list[Mapping[str, Any]],
        *,
        assign_by: str | None = None,
        mode: str | None = None,
    ) -> dict[str, Any]:
        """`variants`: `[{"name": .., "version": .., "weight": ..}, ...]`."""
        body: dict[str, Any] = {"kind": kind, "variants": [dict(v) for v in variants]}
        if assign_by is not None:
            body["assign_by"] = assign_by
        if mode is not None:
            body["mode"] = mode
        return self.request("POST", "/v1/experiments", json_body=body)

    def experiments(self) -> list[dict[str, Any]]:
        answer = self.request("GET", "/v1/experiments")
        return answer["experiments"] if isinstance(answer, dict) else answer

    def experiment_report(self, experiment_id: str) -> dict[str, Any]:
        return self.request("GET", f"/v1/experiments/{experiment_id}")

    def stop_experiment(self, experiment_id: str) -> dict[str, Any]:
        return self.request("POST", f"/v1/experiments/{experiment_id}/stop")

    def promote(self, experiment_id: str, variant: str) -> dict[str, Any]:
        return self.request(
            "POST", f"/v1/experiments/{experiment_id}/promote", json_body={"variant": variant}
        )

    def start_rollout(self, kind: str, version: int, **options: Any) -> dict[str, Any]:
        """`options`: steps, step_ms, guards, min_tasks, assign_by (see the API reference)."""
        return self.request(
            "POST", "/v1/rollouts", json_body={"kind": kind, "version": version, **options}
        )

    def rollouts(self) -> list[dict[str, Any]]:
        answer = self.request("GET", "/v1/rollouts")
        return answer["rollouts"] if isinstance(answer, dict) else answer

    def stop_rollout(self, rollout_id: str) -> dict[str, Any]:
        return self.request("POST", f"/v1/rollouts/{rollout_id}/stop")

    def issue_token(
        self,
        role: str,
        *,
        device: str | None = None,
        tenant: str | None = None,
        worker: str | None = None,
        expires_in_s: int | None = None,
    ) -> IssuedToken:
        body = {
            "role": role,
            "device": device,
            "tenant": tenant,
            "worker": worker,
            "expires_in_s": expires_in_s,
        }
        answer = self.request(
            "POST", "/v1/tokens", json_body={k: v for k, v in body.items() if v is not None}
        )
        return IssuedToken.from_json(answer)

    def tokens(self) -> list[dict[str, Any]]:
        return self.request("GET", "/v1/tokens")["tokens"]

    def revoke_token(self, token_id: str) -> dict[str, Any]:
        return self.request("DELETE", f"/v1/tokens/{token_id}")

    def concurrency_limits(self) -> dict[str, Any]:
        return self.request("GET", "/v1/concurrency-limits")

    def set_concurrency_limit(self, key: str, limit: int) -> dict[str, Any]:
        return self.request(
            "PUT", f"/v1/concurrency-limits/{key}", json_body={"limit": limit}
        )

    def remove_concurrency_limit(self, key: str) -> dict[str, Any]:
        return self.request("DELETE", f"/v1/concurrency-limits/{key}")


def _setting(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(_setting(v) for v in value)
    if isinstance(value, (dict,)):
        return json.dumps(value, separators=(",", ":"))
    return str(value)


def _problem(response: httpx.Response) -> ProblemError:
    try:
        body = response.json()
        if not isinstance(body, dict):
            raise ValueError
    except ValueError:
        body = {"title": response.reason_phrase, "detail": response.text[:500]}
    return ProblemError(response.status_code, body)


def _sse(lines: Iterable[str]) -> Iterator[Event]:
    """Server-sent events' `transition` messages as events; comments and keep-alives skipped."""
    data: list[str] = []
    kind = "message"
    for line in lines:
        if line == "":
            if data and kind == "transition":
                yield Event.from_json(json.loads("\n".join(data)))
            elif data and kind == "error":
                raise TransportError(f"the event stream ended: {' '.join(data)}")
            data, kind = [], "message"
        elif line.startswith(":"):
            continue
        else:
            name, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            if name == "data":
                data.append(value)
            elif name == "event":
                kind = value
