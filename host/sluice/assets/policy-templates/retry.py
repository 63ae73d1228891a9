"""A retry policy: transient failures wait `delay_ms` times the attempt number; anything
else, or the task's last attempt, is dead."""

import sluice_policy as sp
from wit_world import exports


class Retry(sp.RetryPolicy, exports.Retry):
    SETTINGS = {"delay_ms": 1_000}

    def configure(self, settings):
        if settings["delay_ms"] == 0:
            raise sp.ConfigError("delay_ms must be at least 1")

    def decide_failure(self, now_ms, failure):
        if failure.task.attempt >= failure.max_attempts:
            return sp.dead(sp.DEAD_ATTEMPTS_SPENT)
        if failure.error_class in (sp.TRANSIENT, sp.NODE_BUSY, sp.LEASE_EXPIRED):
            return sp.retry_after_ms(self.settings["delay_ms"] * max(failure.task.attempt, 1))
        if failure.error_class == sp.INVALID_INPUT:
            return sp.dead(sp.DEAD_INVALID_INPUT)
        return sp.dead(sp.DEAD_PERMANENT)


class NamedRetry(sp.NamedRetry, exports.NamedRetry):
    """Called instead, with each task's names (failure.task.kind, .tenant, .device, .label())."""

    POLICY = Retry
