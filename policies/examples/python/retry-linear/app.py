"""Retry in Python: attempt n waits n x `delay_ms`, plus up to `jitter_ms` drawn from the host's
random bits so tasks that failed together do not return together; a busy node is retried
after `node_busy_delay_ms` alone (another node may be free), and permanent and invalid-input
failures are dead at once. No wait exceeds a day."""

import sluice_policy as sp
from wit_world import exports

DELAY_LIMIT_MS = 24 * 3_600_000


class Retry(sp.RetryPolicy, exports.Retry):
    SETTINGS = {"delay_ms": 60_000, "jitter_ms": 30_000, "node_busy_delay_ms": 5_000}

    def configure(self, s):
        if s["delay_ms"] == 0:
            raise sp.ConfigError("delay_ms must be at least 1")
        for name in SETTINGS_CAPPED:
            if s[name] > DELAY_LIMIT_MS:
                raise sp.ConfigError(f"{name} must be at most {DELAY_LIMIT_MS}")

    def decide_failure(self, now_ms, f):
        if f.error_class == sp.PERMANENT:
            return sp.dead(sp.DEAD_PERMANENT)
        if f.error_class == sp.INVALID_INPUT:
            return sp.dead(sp.DEAD_INVALID_INPUT)
        if f.task.attempt >= f.max_attempts:
            return sp.dead(sp.DEAD_ATTEMPTS_SPENT)
        s = self.settings
        if f.error_class == sp.NODE_BUSY:
            return sp.retry_after_ms(s["node_busy_delay_ms"])
        jitter = f.random % (s["jitter_ms"] + 1)
        return sp.retry_after_ms(min(s["delay_ms"] * max(f.task.attempt, 1) + jitter, DELAY_LIMIT_MS))


SETTINGS_CAPPED = ("delay_ms", "jitter_ms", "node_busy_delay_ms")
