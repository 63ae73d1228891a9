"""An aging policy: a task that has waited `wait_ms` in its bucket moves up one."""

import sluice_policy as sp
from wit_world import exports


class Aging(sp.AgingPolicy, exports.Aging):
    SETTINGS = {"wait_ms": 600_000}

    def configure(self, settings):
        if settings["wait_ms"] == 0:
            raise sp.ConfigError("wait_ms must be at least 1")

    def promote(self, now_ms, task):
        if task.bucket == sp.URGENT or now_ms - task.bucket_since_ms < self.settings["wait_ms"]:
            return None
        return task.bucket - 1


class NamedAging(sp.NamedAging, exports.NamedAging):
    """Called instead, with each task's names (task.kind, .tenant, .device, .label())."""

    POLICY = Aging
