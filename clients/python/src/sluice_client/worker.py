"""`Worker`: runs an executor on the tasks a Sluice server leases to this process.

It heartbeats, long-polls claims for as many tasks as it has free slots (GPUs × tasks per GPU),
starts each attempt, keeps its lease alive while the executor runs, and reports the outcome
with the lease's token. Reports are retried on network errors, 5xx and 429 while the lease
lasts (the server answers a repeated report as it did the first). When the server answers
`attempt-cancelled` (the task was cancelled or passed its deadline) or `attempt-revoked` (an
urgent task preempted the attempt), the executor is told — `job.cancelled` is set, and an
asyncio executor's task is cancelled — and once it has returned the worker reports `stopped`,
which frees the GPU on the server. `stop()`, SIGTERM or SIGINT drain: no new claims, the
attempts in hand finish and report, then `run()` returns.

With `batch=Batch(max_size=8, max_wait_ms=20)` it claims GPU batches instead: once a whole
batch's places are free, tasks of one kind, model and batch key, on one GPU. An executor with
an `execute_batch(jobs)` method runs each batch as one call (each job keeps its own lease,
cancel signal and report); without one, each job of the batch runs on its own thread.

Threads, not a framework: a claim loop, a heartbeat loop, one thread per running attempt and
one lease keeper beside it, and, for a coroutine executor, one asyncio loop they share.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import json
import logging
import re
import signal
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .client import Client
from .errors import AttemptFailed, AttemptStopped, ProblemError, SluiceError, TransportError
from .types import Gpu, Heartbeat, LeaseGrant, LoadedModel, ShardAnnouncement, Task

log = logging.getLogger("sluice_client.worker")

#: The most tasks one claim asks for (the server's bound).
MAX_CLAIM = 64
#: A report is tried at least this often, and then again while the lease lasts.
REPORT_TRIES = 5
MAX_REPORT_PAUSE_S = 2.0
#: The pause after a claim refused for a reason (breaker open, stale heartbeat), so a refused
#: worker does not spin; `at-capacity` is a race with a report in flight, so its pause is short.
REFUSED_PAUSE_S = 0.5
AT_CAPACITY_PAUSE_S = 0.02
_TOLD_TO_STOP = frozenset({"attempt-cancelled", "attempt-revoked"})
#: The longest a batch may wait to fill, and the most models a batch claim names.
MAX_BATCH_WAIT_MS = 10_000
MAX_BATCH_MODELS = 16
_NAME = re.compile(r"[A-Za-z0-9._:/@-]{1,128}")


@dataclass(frozen=True)
class Batch:
    """How a worker claims GPU batches: at most `max_size` tasks, a batch short of it waiting
    up to `max_wait_ms` for more (the server's `batch_wait_ms` caps it per bucket, 0 for
    urgent), only tasks of `models` when given."""

    max_size: int
    max_wait_ms: int = 20
    models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not 1 <= self.max_size <= MAX_CLAIM:
            raise ValueError(f"a batch holds 1 to {MAX_CLAIM} tasks, not {self.max_size}")
        if not 0 <= self.max_wait_ms <= MAX_BATCH_WAIT_MS:
            raise ValueError(f"max_wait_ms is 0 to {MAX_BATCH_WAIT_MS}, not {self.max_wait_ms}")
        if isinstance(self.models, str):
            raise ValueError("models is a list of model names, not one string")
        if len(self.models) > MAX_BATCH_MODELS:
            raise ValueError(f"at most {MAX_BATCH_MODELS} models")
        for model in self.models:
            if not isinstance(model, str) or not _NAME.fullmatch(model):
                raise ValueError(
                    f"model {model!r} is not 1 to 128 of A-Z a-z 0-9 . _ - : / @"
                )

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"max_size": self.max_size, "max_wait_ms": self.max_wait_ms}
        if self.models:
            body["models"] = list(self.models)
        return body


@dataclass
class Job:
    """One attempt handed to the executor."""

    grant: LeaseGrant
    #: Set when the server ends the task or preempts the attempt: stop the work and return.
    cancelled: threading.Event
    worker: Worker

    @property
    def task(self) -> Task:
        return self.grant.task

    @property
    def payload(self) -> Any:
        return self.grant.payload

    @property
    def attempt(self) -> int:
        return self.grant.attempt

    @property
    def gpu(self) -> int | None:
        """The GPU the server placed this attempt on, when the worker announced GPUs."""
        lease = self.grant.task.lease
        return lease.gpu if lease is not None else None

    def check(self) -> None:
        """Raises `AttemptStopped` once the attempt must stop: call it between steps."""
        if self.cancelled.is_set():
            raise AttemptStopped(f"task {self.task.id}: stop the attempt")


#: An executor: a function (or a coroutine function) of a `Job`, or an object with such an
#: `execute` method. What it returns is the task's result (JSON); raising `AttemptFailed` (or a
#: subclass) fails the attempt with its class, any other exception as `transient`.
Executor = Callable[[Job], Any]


@dataclass
class WorkerStats:
    claimed: int = 0
    completed: int = 0
    failed: int = 0
    #: Reports the server refused as stale: the lease had passed to another attempt.
    refused: int = 0
    #: Attempts stopped because the server ended their task or preempted them.
    stopped: int = 0
    errors: int = 0
    #: GPU batches run through `execute_batch`.
    batches: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)

    def line(self) -> str:
        return (
            f"claimed {self.claimed} completed {self.completed} failed {self.failed} "
            f"refused {self.refused} stopped {self.stopped} errors {self.errors}"
        )


class Worker:
    """A worker process's loop. `gpus`: how many GPUs (each of `gpu_memory_mb`), or their
    list; `per_gpu`: attempts run at once on each. `kinds`: the task kinds it runs (empty:
    any). `labels`: what tasks may require of it. `vectors`: the shard a vector shard worker
    holds."""

    def __init__(
        self,
        client: Client,
        worker_id: str,
        executor: Executor | Any,
        *,
        gpus: int | Sequence[Gpu] = 1,
        gpu_memory_mb: int = 16_384,
        per_gpu: int = 1,
        kinds: Sequence[str] = (),
        labels: Mapping[str, str] | None = None,
        loaded_models: Sequence[LoadedModel] = (),
        vectors: ShardAnnouncement | None = None,
        claim_wait_ms: int = 5_000,
        heartbeat_interval_s: float = 2.0,
        batch: Batch | None = None,
    ):
        if isinstance(gpus, int):
            gpus = [Gpu(memory_mb=gpu_memory_mb) for _ in range(gpus)]
        self.client = client
        self.id = worker_id
        self.batch = batch
        # A GPU takes a whole batch's tasks at once.
        if batch is not None:
            per_gpu = max(per_gpu, batch.max_size)
        self.slots = max(1, len(gpus) * max(1, per_gpu))
        self._heartbeat = Heartbeat(
            gpus=list(gpus),
            labels=dict(labels or {}),
            kinds=list(kinds),
            max_concurrency=self.slots,
            vectors=vectors,
        )
        self._models = list(loaded_models)
        batch_call = getattr(executor, "execute_batch", None)
        self._batch_call: Callable[[list[Job]], Any] | None = (
            batch_call if callable(batch_call) and batch is not None else None
        )
        self._call = _callable(executor, batches_only=self._batch_call is not None)
        self._is_async = inspect.iscoroutinefunction(self._call)
        self.claim_wait_ms = claim_wait_ms
        self.heartbeat_interval_s = heartbeat_interval_s
        self.stats = WorkerStats()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        # Heartbeats go on through a drain, so the server sees a live worker finishing its
        # attempts; they end once every attempt has reported.
        self._beats_done = threading.Event()
        self._beat_now = threading.Event()
        self._free = threading.Semaphore(self.slots)
        self._fatal: SluiceError | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    # --- what an executor may call -------------------------------------------------------

    def loaded(self, name: str, gpu: int, memory_mb: int) -> None:
        """The executor has loaded model `name` on `gpu`: announced at once, so tasks for it
        find this worker."""
        with self._lock:
            self._models = [m for m in self._models if m.name != name]
            self._models.append(LoadedModel(name=name, gpu=gpu, memory_mb=memory_mb))
        self._beat_now.set()

    def unloaded(self, name: str) -> None:
        with self._lock:
            self._models = [m for m in self._models if m.name != name]
        self._beat_now.set()

    # --- running -------------------------------------------------------------------------

    def stop(self) -> None:
        """Drain: claim nothing more; `run()` returns once the attempts in hand have reported."""
        self._stopping.set()

    def run(self, *, handle_signals: bool = True) -> WorkerStats:
        """Works until `stop()` (or SIGTERM/SIGINT, when called on the main thread with
        `handle_signals`), then drains and returns what it did. Raises when the first
        heartbeat is refused, or when a claim is refused for good (401, 403)."""
        self.client.heartbeat(self.id, self._heartbeat_now())
        restore = self._install_signals() if handle_signals else {}
        loop_thread = None
        if self._is_async:
            self._loop = asyncio.new_event_loop()
            loop_thread = threading.Thread(
                target=self._loop.run_forever, name=f"{self.id}-asyncio", daemon=True
            )
            loop_thread.start()
        beats = threading.Thread(target=self._heartbeats, name=f"{self.id}-heartbeat", daemon=True)
        beats.start()
        attempts = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.slots, thread_name_prefix=f"{self.id}-attempt"
        )
        claims = threading.Thread(
            target=self._claims, args=(attempts,), name=f"{self.id}-claims", daemon=True
        )
        claims.start()
        try:
            # The main thread only waits, in short steps, so a signal's handler runs at once.
            while claims.is_alive():
                claims.join(0.2)
        finally:
            self._stopping.set()
            claims.join()
            attempts.shutdown(wait=True)
            self._beats_done.set()
            self._beat_now.set()
            beats.join(timeout=self.client.timeout_s)
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                if loop_thread is not None:
                    loop_thread.join(timeout=5)
            for signum, handler in restore.items():
                signal.signal(signum, handler)
        log.info("worker %s drained: %s", self.id, self.stats.line())
        if self._fatal is not None:
            raise self._fatal
        return self.stats

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        restore = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            restore[signum] = signal.signal(signum, lambda *_: self.stop())
        return restore

    def _heartbeat_now(self) -> Heartbeat:
        with self._lock:
            models = list(self._models)
        beat = Heartbeat(**{**self._heartbeat.__dict__, "loaded_models": models or None})
        return beat

    def _heartbeats(self) -> None:
        while not self._beats_done.is_set():
            self._beat_now.wait(self.heartbeat_interval_s)
            self._beat_now.clear()
            if self._beats_done.is_set():
                return
            try:
                self.client.heartbeat(self.id, self._heartbeat_now())
            except SluiceError as error:
                self.stats.add("errors")
                log.warning("heartbeat of %s failed: %s", self.id, error)

    def _claims(self, attempts: concurrent.futures.ThreadPoolExecutor) -> None:
        try:
            self._claim_loop(attempts)
        except Exception as error:  # noqa: BLE001 - a bug here must stop the worker loudly
            log.exception("the claim loop of %s broke", self.id)
            self._fatal = SluiceError(f"the claim loop broke: {error!r}")
            self._stopping.set()

    def _claim_loop(self, attempts: concurrent.futures.ThreadPoolExecutor) -> None:
        # A claim that got no answer is sent again under the same name, so the leases it may
        # have granted come back instead of waiting out their timeout.
        unanswered: str | None = None
        # A batch waits for a whole batch's places; single tasks for one.
        wanted = min(self.batch.max_size, self.slots) if self.batch is not None else 1
        while not self._stopping.is_set():
            taken = self._take_places(wanted)
            if taken == 0:
                continue
            claim_id = unanswered or uuid.uuid4().hex
            unanswered = None
            batch = None
            if self.batch is not None:
                # One batch at a time: the places past it go back at once.
                free = min(taken, self.batch.max_size)
                self._release(taken - free)
                batch = {**self.batch.body(), "max_size": free}
            else:
                free = taken
            try:
                answer = self.client.claim(
                    self.id,
                    max_tasks=free,
                    wait_ms=self.claim_wait_ms,
                    claim_id=claim_id,
                    batch=batch,
                )
            except ProblemError as error:
                self._release(free)
                self.stats.add("errors")
                if error.status in (401, 403):
                    log.error("claims of %s are refused for good: %s", self.id, error)
                    self._fatal = error
                    self._stopping.set()
                    return
                if error.retryable:
                    unanswered = claim_id
                log.warning("claim of %s failed: %s", self.id, error)
                self._stopping.wait(REFUSED_PAUSE_S)
                continue
            except TransportError as error:
                self._release(free)
                self.stats.add("errors")
                unanswered = claim_id
                log.warning("claim of %s got no answer: %s", self.id, error)
                self._stopping.wait(REFUSED_PAUSE_S)
                continue
            self._release(free - len(answer.leases))
            if answer.reason is not None and not answer.leases:
                code = answer.reason.code
                log.debug("claim refused: %s (%s)", code, answer.reason.detail)
                if code in ("unknown-worker", "stale-heartbeat"):
                    self._beat_now.set()
                pause = AT_CAPACITY_PAUSE_S if code == "at-capacity" else REFUSED_PAUSE_S
                self._stopping.wait(pause)
                continue
            if self._batch_call is not None and self.batch is not None and answer.leases:
                self.stats.add("claimed", len(answer.leases))
                self.stats.add("batches")
                attempts.submit(self._run_batch, list(answer.leases))
                continue
            for grant in answer.leases:
                self.stats.add("claimed")
                attempts.submit(self._attempt, grant)

    def _take_places(self, wanted: int) -> int:
        """Waits (0.2 s at most) for `wanted` free places and takes them, with any more free
        (up to `MAX_CLAIM`): how many it took, 0 when there were not enough."""
        taken = 0
        deadline = time.monotonic() + 0.2
        while taken < wanted:
            left = deadline - time.monotonic()
            if left <= 0 or not self._free.acquire(timeout=left):
                self._release(taken)
                return 0
            taken += 1
        while taken < MAX_CLAIM and self._free.acquire(blocking=False):
            taken += 1
        return taken

    def _release(self, n: int) -> None:
        for _ in range(max(0, n)):
            self._free.release()

    # --- one attempt ---------------------------------------------------------------------

    def _attempt(self, grant: LeaseGrant) -> None:
        try:
            self._run_attempt(grant)
        except Exception:  # noqa: BLE001 - a bug here must not lose the slot
            self.stats.add("errors")
            log.exception("attempt of task %s broke", grant.task.id)
        finally:
            self._free.release()

    def _run_attempt(self, grant: LeaseGrant) -> None:
        lease = _LeaseClock(grant)
        started = self._report(grant, "start", {}, lease)
        if started == "cancelled":
            self._stopped(grant, lease)
            return
        if started != "done":
            return
        job = Job(grant=grant, cancelled=threading.Event(), worker=self)
        keeper_done = threading.Event()
        keeper = threading.Thread(
            target=self._keep_alive, args=(job, lease, keeper_done), daemon=True
        )
        keeper.start()
        try:
            outcome = self._execute(job)
        finally:
            keeper_done.set()
        self._finish(job, lease, outcome)

    def _run_batch(self, grants: list[LeaseGrant]) -> None:
        """A GPU batch: each task started (its own report), the started ones through one
        `execute_batch(jobs)` call while their leases are kept, then each outcome reported."""
        try:
            running: list[tuple[Job, _LeaseClock]] = []
            for grant in grants:
                lease = _LeaseClock(grant)
                started = self._report(grant, "start", {}, lease)
                if started == "cancelled":
                    self._stopped(grant, lease)
                elif started == "done":
                    running.append((Job(grant=grant, cancelled=threading.Event(), worker=self), lease))
            if not running:
                return
            keepers_done = threading.Event()
            for job, lease in running:
                threading.Thread(
                    target=self._keep_alive, args=(job, lease, keepers_done), daemon=True
                ).start()
            try:
                outcomes = self._execute_batch([job for job, _ in running])
            finally:
                keepers_done.set()
            for (job, lease), outcome in zip(running, outcomes):
                self._finish(job, lease, outcome)
        except Exception:  # noqa: BLE001 - a bug here must not lose the slots
            self.stats.add("errors")
            log.exception("a batch of %d tasks broke", len(grants))
        finally:
            self._release(len(grants))

    def _execute_batch(self, jobs: list[Job]) -> list[tuple]:
        """One outcome per job: `execute_batch` answers a list with a result, or an exception
        (AttemptFailed and the others, as `execute` raises them), per job."""
        assert self._batch_call is not None
        try:
            answers = self._batch_call(jobs)
            if inspect.iscoroutine(answers):
                if self._loop is not None:
                    answers = asyncio.run_coroutine_threadsafe(answers, self._loop).result()
                else:
                    answers = asyncio.run(answers)
            answers = list(answers)
        except (asyncio.CancelledError, concurrent.futures.CancelledError):
            return [("stopped",)] * len(jobs)
        except Exception as error:  # noqa: BLE001 - the executor's failure is the batch's
            return [_outcome(job, error) for job in jobs]
        outcomes = []
        for index, job in enumerate(jobs):
            if index >= len(answers):
                outcomes.append(("fail", "transient", "execute_batch gave no answer for this task"))
            else:
                outcomes.append(_outcome(job, answers[index]))
        return outcomes

    def _finish(self, job: Job, lease: _LeaseClock, outcome: tuple) -> None:
        """Reports an attempt's outcome (or `stopped`, when the server ended it meanwhile)."""
        grant = job.grant
        if job.cancelled.is_set() or outcome[0] == "stopped":
            self._stopped(grant, lease)
            return
        if outcome[0] == "complete":
            body, counter = {"result": outcome[1]}, "completed"
        else:
            body, counter = {"class": outcome[1], "message": outcome[2]}, "failed"
        reported = self._report(grant, outcome[0], body, lease)
        if reported == "too-large":
            # The server keeps results up to `max_result_bytes` (and bodies a little over): a
            # bigger one can never be stored, so the attempt fails for good instead of running
            # again.
            body = {
                "class": "permanent",
                "message": "the result is over the server's max_result_bytes",
            }
            counter = "failed"
            reported = self._report(grant, "fail", body, lease)
        if reported == "done":
            self.stats.add(counter)
        elif reported == "cancelled":
            # Cancelled as it ended: the server freed the GPU on hearing the outcome.
            self.stats.add("stopped")

    def _execute(self, job: Job) -> tuple:
        """("complete", result) | ("fail", class, message) | ("stopped",)."""
        try:
            result = self._execute_async(job) if self._is_async else self._call(job)
        except (asyncio.CancelledError, concurrent.futures.CancelledError):
            return ("stopped",)
        except Exception as error:  # noqa: BLE001 - the executor's failure is the attempt's
            return _outcome(job, error)
        return _outcome(job, result)

    def _execute_async(self, job: Job) -> Any:
        assert self._loop is not None
        future = asyncio.run_coroutine_threadsafe(self._call(job), self._loop)
        while True:
            try:
                return future.result(timeout=0.05)
            except concurrent.futures.TimeoutError:
                if job.cancelled.is_set():
                    # Cancels the coroutine's task: CancelledError is raised inside it.
                    future.cancel()

    def _stopped(self, grant: LeaseGrant, lease: _LeaseClock) -> None:
        self.stats.add("stopped")
        log.info("stopped the attempt of task %s: its task ended, or it was preempted", grant.task.id)
        self._report(grant, "stopped", {}, lease)

    def _report(
        self, grant: LeaseGrant, report: str, body: dict[str, Any], lease: _LeaseClock
    ) -> str:
        """"done", "cancelled" (told to stop), "refused" (stale), "too-large" (a result over
        the server's bound) or "failed"."""
        pause = 0.1
        tries = 0
        while True:
            tries += 1
            try:
                task = self.client.report(grant.task.id, report, grant.lease_token, **body)
                lease.renewed(task)
                return "done"
            except ProblemError as error:
                if error.status == 409 and error.type in _TOLD_TO_STOP:
                    return "cancelled"
                if error.status == 413 and report == "complete":
                    return "too-large"
                if error.status == 409:
                    self.stats.add("refused")
                    log.info("%s of task %s refused: %s", report, grant.task.id, error.detail)
                    return "refused"
                if not error.retryable:
                    self.stats.add("errors")
                    log.warning("%s of task %s rejected: %s", report, grant.task.id, error)
                    return "failed"
                failure: SluiceError = error
            except TransportError as error:
                failure = error
            self.stats.add("errors")
            if tries >= REPORT_TRIES and lease.left_s() <= 0:
                log.warning("%s of task %s failed; the lease is over: %s", report, grant.task.id, failure)
                return "failed"
            log.warning("%s of task %s failed; retrying: %s", report, grant.task.id, failure)
            time.sleep(pause)
            pause = min(pause * 2, MAX_REPORT_PAUSE_S)

    def _keep_alive(self, job: Job, lease: _LeaseClock, done: threading.Event) -> None:
        """Heartbeats the lease three times per lease length until `done`; sets
        `job.cancelled` (and stops) when the server says the attempt must stop."""
        every = max(lease.length_s / 3, 0.1)
        while not done.wait(every):
            try:
                task = self.client.report(job.task.id, "heartbeat", job.grant.lease_token)
                lease.renewed(task)
            except ProblemError as error:
                if error.status == 409 and error.type in _TOLD_TO_STOP:
                    log.info("task %s: %s; stopping the attempt", job.task.id, error.type)
                    job.cancelled.set()
                    return
                log.warning("lease heartbeat of task %s failed: %s", job.task.id, error)
            except TransportError as error:
                log.warning("lease heartbeat of task %s failed: %s", job.task.id, error)


class _LeaseClock:
    """When an attempt's lease ends, by this machine's clock: the server's lease length
    (expiry less claim time, both its own clock) counted from when the grant arrived, so a
    skew between the two clocks does not matter."""

    def __init__(self, grant: LeaseGrant):
        lease = grant.task.lease
        claimed = lease.claimed_at_ms if lease is not None and lease.claimed_at_ms else None
        if claimed is not None:
            self.length_s = max(grant.lease_expires_at_ms - claimed, 0) / 1000
        else:
            self.length_s = max(grant.lease_expires_at_ms / 1000 - time.time(), 0.3)
        self._ends = time.monotonic() + self.length_s

    def renewed(self, task: Task) -> None:
        self._ends = time.monotonic() + self.length_s

    def left_s(self) -> float:
        return self._ends - time.monotonic()


def _outcome(job: Job, answer: Any) -> tuple:
    """An attempt's outcome from what its executor returned or raised (or, in a batch, the
    job's item of the answer): ("complete", result) | ("fail", class, message) | ("stopped",)."""
    if isinstance(answer, AttemptStopped):
        return ("stopped",)
    if isinstance(answer, AttemptFailed):
        return ("fail", answer.failure_class, str(answer)[:4096])
    if isinstance(answer, BaseException):
        if job.cancelled.is_set():
            return ("stopped",)
        line = traceback.format_exception_only(type(answer), answer)[-1].strip()
        return ("fail", "transient", line[:4096])
    try:
        json.dumps(answer)
    except (TypeError, ValueError) as error:
        return ("fail", "permanent", f"the executor's result is not JSON: {error}"[:4096])
    return ("complete", answer)


def _callable(executor: Any, *, batches_only: bool = False) -> Callable[[Job], Any]:
    if hasattr(executor, "execute") and callable(executor.execute):
        return executor.execute
    if callable(executor):
        return executor
    if batches_only:
        return _no_single_execute
    raise TypeError(
        "an executor is a function of a Job, or an object with an execute(job) method "
        "(or, for a worker with batch=Batch(...), an execute_batch(jobs) method)"
    )


def _no_single_execute(job: Job) -> Any:
    raise AttemptFailed("this executor runs batches only (execute_batch)", "transient")
