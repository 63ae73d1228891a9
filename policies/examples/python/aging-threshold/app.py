"""Aging in Python: low moves to normal after `low_to_normal_ms` in its bucket, normal to urgent
after `normal_to_urgent_ms`, one step per tick. Answers as policies/aging-threshold does."""

import sluice_policy as sp
from wit_world import exports


class Aging(sp.AgingPolicy, exports.Aging):
    SETTINGS = {"low_to_normal_ms": 1_800_000, "normal_to_urgent_ms": 1_800_000}

    def configure(self, s):
        if s["low_to_normal_ms"] == 0 or s["normal_to_urgent_ms"] == 0:
            raise sp.ConfigError("waits must be at least 1 ms")

    def promote(self, now_ms, task):
        waited = max(now_ms - task.bucket_since_ms, 0)
        if task.bucket == sp.LOW and waited >= self.settings["low_to_normal_ms"]:
            return sp.NORMAL
        if task.bucket == sp.NORMAL and waited >= self.settings["normal_to_urgent_ms"]:
            return sp.URGENT
        return None
