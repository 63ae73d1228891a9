"""A priority policy: tasks whose kind starts with one of `urgent_prefixes` (a setting, e.g.
`urgent_prefixes=oct.,ed.`), or that carry the label `ed=true`, wait in urgent; the rest in
the bucket they were submitted to. First come first served in each bucket; an attempt may run
twice its estimate."""

import sluice_policy as sp
from wit_world import exports


class Priority(sp.PriorityPolicy, exports.Priority):
    SETTINGS = {"urgent_prefixes": []}

    def admit_task(self, now_ms, task):
        prefixes = self.settings["urgent_prefixes"]
        urgent = task.kind.startswith(tuple(prefixes)) or task.label("ed") == "true"
        bucket = sp.URGENT if urgent else task.submitted_bucket
        return sp.admission(bucket, task.seq, max(task.est_exec_ms * 2, 1))


class Fairness(sp.Fairness, exports.Fairness):
    POLICY = Priority


class NamedPriority(sp.NamedPriority, exports.NamedPriority):
    POLICY = Priority
