"""The exceptions the client raises, and the ones an executor raises to fail an attempt."""

from __future__ import annotations

from typing import Any

PROBLEM_PREFIX = "urn:sluice:problem:"


class SluiceError(Exception):
    """Anything the client could not do."""


class ProblemError(SluiceError):
    """The server answered with an error (an `application/problem+json` body).

    `type` is the problem's short type (`stale-lease`, `task-not-found`, ...: the part after
    `urn:sluice:problem:`), `status` the HTTP status, `body` the whole problem document (some
    carry more, such as `task_id` or `retry_after_s`).
    """

    def __init__(self, status: int, body: dict[str, Any]):
        self.status = status
        self.body = body
        full = str(body.get("type", ""))
        self.type = full[len(PROBLEM_PREFIX):] if full.startswith(PROBLEM_PREFIX) else full
        self.title = str(body.get("title", ""))
        self.detail = str(body.get("detail", ""))
        super().__init__(f"{self.title or 'error'} ({status}, {self.type}): {self.detail}")

    @property
    def retryable(self) -> bool:
        """Whether the same request may succeed later: a 5xx or a 429."""
        return self.status >= 500 or self.status == 429


class TransportError(SluiceError):
    """The request got no answer: connection refused or reset, a timeout, a TLS failure."""


class AttemptFailed(Exception):
    """Raised by an executor to fail its attempt with a failure class the retry policy reads.

    Any other exception fails the attempt as `transient`.
    """

    failure_class = "transient"

    def __init__(self, message: str, failure_class: str | None = None):
        super().__init__(message)
        if failure_class is not None:
            self.failure_class = failure_class


class TransientError(AttemptFailed):
    """A failure another attempt may not meet (a busy GPU, a lost connection)."""

    failure_class = "transient"


class PermanentError(AttemptFailed):
    """A failure no retry can fix."""

    failure_class = "permanent"


class InvalidInputError(AttemptFailed):
    """The task's input is wrong: no retry can fix it."""

    failure_class = "invalid-input"


class AttemptStopped(Exception):
    """Raised into an asyncio executor (as its task's cancellation) or by `Job.check()` when the
    server has ended the task or preempted the attempt: stop the work."""
