"""Sluice's policy SDK for Python: the packed layouts of `wit/policy.wit` as plain classes with
each task's names (kind, tenant, device, labels), the `name=value` config format with typed
settings and errors, and one base class per kind that turns a single per-task method into both
the batch export and its `-one` twin, so the two always agree.

A policy subclasses the kind's base class beside the generated export protocol, and declares
the kind's named export (which the host calls with the names) the same way:

    from wit_world import exports
    import sluice_policy as sp

    class Retry(sp.RetryPolicy, exports.Retry):
        SETTINGS = {"initial_delay_ms": 300_000, "urgent_kinds": ["oct.qa"]}
        def decide_failure(self, now_ms, failure): ...   # failure.task.kind, .label("ed")

    class NamedRetry(sp.NamedRetry, exports.NamedRetry):
        POLICY = Retry

Merge and split policies subclass `MergePolicy` and `SplitPolicy` alike (worlds `merge-policy`,
`split-layout-policy`). Build it with
`componentize-py -d wit -w named-retry-policy componentize app -p . -o x.wasm`
(see policies/README.md). Every decision must be a pure function of its arguments: the host
freezes the clock at the call's `now_ms` and gives seeded random bits, so `time` and `random`
replay, but the arguments are where a decision's inputs belong.
"""

import json  # imported here, not where used: componentize-py bundles what the module imports
import struct
from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Tuple

try:
    from componentize_py_types import Err
except ImportError:  # run natively, by a unit test: the same exception, without the bindings

    class Err(Exception):
        def __init__(self, value):
            super().__init__(value)
            self.value = value

# Buckets, coded as in the WIT `bucket` enum.
URGENT, NORMAL, LOW = 0, 1, 2
BUCKET_NAMES = ("urgent", "normal", "low")

# Error classes of a failure.
TRANSIENT, NODE_BUSY, LEASE_EXPIRED, TIMEOUT, PERMANENT, INVALID_INPUT = range(6)

# Why a task is dead.
DEAD_PERMANENT, DEAD_INVALID_INPUT, DEAD_ATTEMPTS_SPENT, DEAD_POLICY = range(4)

VIEW_WORDS = 6
FAILURE_WORDS = 8
_DEAD = 1 << 63
_U32 = 0xFFFF_FFFF


class ConfigError(Exception):
    """A config the policy refuses: the message is what the uploader sees."""


def fnv1a32(name: str) -> int:
    """The 32-bit code a task view carries for a tenant or kind name."""
    code = 0x811C9DC5
    for byte in name.encode():
        code = ((code ^ byte) * 0x01000193) & _U32
    return code


@dataclass(frozen=True)
class Names:
    """A task's names: kind, tenant and device as submitted, and its labels."""

    kind: str = ""
    tenant: str = ""
    device: str = ""
    labels: Tuple[Tuple[str, str], ...] = ()

    @staticmethod
    def of(record) -> "Names":
        """From the WIT `task-names` record the host sends."""
        return Names(record.kind, record.tenant, record.device, tuple(record.labels))


NO_NAMES = Names()


@dataclass(frozen=True)
class Task:
    """A task as a policy sees it: its packed view (6 words) and its names."""

    seq: int
    tenant_code: int
    kind_code: int
    created_ms: int
    bucket_since_ms: int
    est_exec_ms: int
    attempt: int
    bucket: int
    submitted_bucket: int
    kind: str = ""
    tenant: str = ""
    device: str = ""
    labels: Tuple[Tuple[str, str], ...] = ()

    def label(self, name: str) -> Optional[str]:
        """The value of label `name`, if the task has it."""
        for key, value in self.labels:
            if key == name:
                return value
        return None

    @staticmethod
    def unpack(words, names: Names = NO_NAMES) -> "Task":
        seq, tenant_kind, created, since, est, packed = words
        return Task(
            seq=seq,
            tenant_code=tenant_kind >> 32,
            kind_code=tenant_kind & _U32,
            created_ms=created,
            bucket_since_ms=since,
            est_exec_ms=est,
            attempt=packed >> 32,
            bucket=(packed >> 8) & 0xFF,
            submitted_bucket=packed & 0xFF,
            kind=names.kind,
            tenant=names.tenant,
            device=names.device,
            labels=names.labels,
        )

    @staticmethod
    def of(seq=0, bucket=NORMAL, kind="", tenant="", device="", labels=None, **view) -> "Task":
        """A task for a unit test: `Task.of(kind="oct.qa", bucket=sp.LOW, labels={"ed": "true"})`."""
        fields = dict(created_ms=0, bucket_since_ms=0, est_exec_ms=0, attempt=0)
        fields.update(view)
        fields.setdefault("submitted_bucket", bucket)
        return Task(
            seq=seq,
            tenant_code=fnv1a32(tenant),
            kind_code=fnv1a32(kind),
            bucket=bucket,
            kind=kind,
            tenant=tenant,
            device=device,
            labels=tuple(sorted((labels or {}).items())),
            **fields,
        )


@dataclass(frozen=True)
class Failure:
    """A failed attempt: the task, its error class, its attempt budget and random bits."""

    task: Task
    error_class: int
    max_attempts: int
    random: int

    @staticmethod
    def unpack(words, names: Names = NO_NAMES) -> "Failure":
        class_max = words[6]
        task = Task.unpack(words[0:6], names)
        return Failure(task, class_max >> 32, class_max & _U32, words[7])


def _batch_names(names, which) -> List[Names]:
    """Each task's names from a batch's distinct ones and the index of each task's."""
    distinct = [Names.of(record) for record in names]
    return [distinct[index] for index in which]


def admission(bucket: int, rank: int, attempt_timeout_ms: int) -> Tuple[int, int, int]:
    """A priority decision: the bucket to wait in, the rank there (lower first), and how long
    one attempt may run (at least 1 ms)."""
    if bucket not in (URGENT, NORMAL, LOW) or rank < 0 or attempt_timeout_ms < 1:
        raise ValueError(f"admission ({bucket}, {rank}, {attempt_timeout_ms}) out of range")
    return (bucket, rank, attempt_timeout_ms)


def retry_after_ms(delay_ms: int) -> int:
    """A retry decision: wait `delay_ms`, then run again."""
    if not 0 <= delay_ms < _DEAD:
        raise ValueError(f"delay {delay_ms} ms out of range")
    return delay_ms


def dead(reason: int) -> int:
    """A retry decision: the task is dead for `reason` (one of the DEAD_* codes)."""
    return _DEAD | reason


def _json(name: str, value: str, kind: type):
    try:
        parsed = json.loads(value)
    except ValueError as error:
        raise ConfigError(f"{name}: not JSON ({error})")
    if not isinstance(parsed, kind):
        what = "object" if kind is dict else "list"
        raise ConfigError(f"{name}: expected a JSON {what}, not {value!r}")
    return parsed


def _like(name: str, value, default):
    """A JSON `value` checked against `default`'s type (text, integer, true/false, list, object;
    any when there is no default to go by)."""
    if default is None:
        return value
    if isinstance(default, bool) or isinstance(value, bool):
        if not (isinstance(default, bool) and isinstance(value, bool)):
            raise ConfigError(f"{name}: {value!r} is not {type(default).__name__}")
        return value
    if isinstance(default, int):
        if not isinstance(value, int) or value < 0:
            raise ConfigError(f"{name}: {value!r} is not a non-negative integer")
        return value
    if isinstance(default, str):
        if not isinstance(value, str):
            raise ConfigError(f"{name}: {value!r} is not text")
        return value
    if isinstance(default, (list, tuple)):
        if not isinstance(value, list):
            raise ConfigError(f"{name}: {value!r} is not a list")
        item = default[0] if default else None
        return [_like(name, v, item) for v in value]
    if isinstance(default, dict):
        if not isinstance(value, dict):
            raise ConfigError(f"{name}: {value!r} is not an object")
        item = next(iter(default.values()), None)
        return {k: _like(f"{name}.{k}", v, item) for k, v in value.items()}
    return value


def _typed(name: str, value: str, default):
    """`value` as the type of `default`: a non-negative integer, text, true/false, a list (a
    JSON array, or comma-separated) of the type of the default's items (text when the default
    list is empty), or a JSON object whose values are of the type of the default's."""
    if isinstance(default, dict):
        return _like(name, _json(name, value, dict), default)
    if isinstance(default, (list, tuple)) and value.startswith("["):
        return _like(name, _json(name, value, list), list(default) or [""])
    if isinstance(default, bool):
        if value not in ("true", "false"):
            raise ConfigError(f"{name}: {value!r} is not true or false")
        return value == "true"
    if isinstance(default, int):
        if not value.isdigit():
            raise ConfigError(f"{name}: {value!r} is not a non-negative integer")
        return int(value)
    if isinstance(default, (list, tuple)):
        item = default[0] if default else ""
        items = [part.strip() for part in value.split(",")] if value else []
        return [_typed(name, part, item) for part in items]
    return value


def parse_config(config: bytes, defaults: Dict[str, object]) -> Dict[str, object]:
    """`name=value` lines (blank lines and `#` comments skipped) over `defaults`, each value
    read as its default's type (an integer, text, true/false, a list as JSON or comma-separated,
    or a JSON object); an
    unknown name, a repeated name or a value of the wrong type is refused."""
    try:
        text = config.decode()
    except UnicodeDecodeError:
        raise ConfigError("config is not UTF-8")
    settings = dict(defaults)
    seen = set()
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = (part.strip() for part in line.partition("="))
        if not sep:
            raise ConfigError(f"line {number}: expected name=value")
        if name not in defaults:
            known = ", ".join(sorted(defaults)) or "none"
            raise ConfigError(f"unknown setting {name!r} (known: {known})")
        if name in seen:
            raise ConfigError(f"{name} is set twice")
        seen.add(name)
        settings[name] = _typed(name, value, defaults[name])
    return settings


class _Configured:
    """Parses `SETTINGS` at init and hands them to `configure`, which may refuse them."""

    SETTINGS: ClassVar[Dict[str, object]] = {}
    settings: Dict[str, object] = {}

    def init(self, config: bytes) -> None:
        try:
            settings = parse_config(config, self.SETTINGS)
            self.configure(settings)
        except ConfigError as error:
            raise Err(str(error))
        # componentize-py may build a fresh object for each call, so settings live on the class.
        type(self).settings = settings

    def configure(self, settings: Dict[str, object]) -> None:
        """Checks settings beyond their type; raise ConfigError to refuse them."""

    @classmethod
    def configured(cls, config: bytes = b"") -> "_Configured":
        """The policy with `config` applied, for a unit test (ConfigError if refused)."""
        settings = parse_config(config, cls.SETTINGS)
        policy = cls()
        policy.configure(settings)
        cls.settings = settings
        return policy


class PriorityPolicy(_Configured):
    """Implement `admit_task(now_ms, task) -> admission(bucket, rank, attempt_timeout_ms)`;
    `weights()` gives the shares of claims served from urgent, normal and low, and
    `tenant_weights()` fair-share weights by tenant name (none: every tenant alike)."""

    def admit_task(self, now_ms: int, task: Task) -> Tuple[int, int, int]:
        raise NotImplementedError

    def weights(self) -> Tuple[int, int, int]:
        return (60, 35, 5)

    def tenant_weights(self) -> List[Tuple[str, int]]:
        return []

    def bucket_weights(self) -> List[int]:
        return list(self.weights())

    def admit_all(self, now_ms: int, tasks: List[int], each: List[Names]) -> List[int]:
        answers: List[int] = []
        for index, at in enumerate(range(0, len(tasks) - VIEW_WORDS + 1, VIEW_WORDS)):
            task = Task.unpack(tasks[at : at + VIEW_WORDS], each[index] if each else NO_NAMES)
            answers.extend(self.admit_task(now_ms, task))
        return answers

    def admit(self, now_ms: int, tasks: List[int]) -> List[int]:
        return self.admit_all(now_ms, tasks, [])

    def admit_one(self, now_ms: int, task: Tuple[int, ...]) -> Tuple[int, int, int]:
        return self.admit_task(now_ms, Task.unpack(task))


class Fairness:
    """The `fairness` export: `POLICY`'s `tenant_weights()`."""

    POLICY: ClassVar[type]

    def tenant_weights(self) -> List[Tuple[str, int]]:
        return self.POLICY().tenant_weights()


class NamedPriority:
    """The `named-priority` export: `POLICY` (a PriorityPolicy) called with each task's names."""

    POLICY: ClassVar[type]

    def reads_names(self) -> bool:
        return True

    def admit(self, now_ms: int, tasks: List[int], names, which) -> List[int]:
        return self.POLICY().admit_all(now_ms, tasks, _batch_names(names, which))

    def admit_one(self, now_ms: int, task: Tuple[int, ...], names) -> Tuple[int, int, int]:
        return self.POLICY().admit_task(now_ms, Task.unpack(task, Names.of(names)))


class RetryPolicy(_Configured):
    """Implement `decide_failure(now_ms, failure) -> int` (a `retry_after_ms` or `dead`)."""

    def decide_failure(self, now_ms: int, failure: Failure) -> int:
        raise NotImplementedError

    def decide_all(self, now_ms: int, failures: List[int], each: List[Names]) -> List[int]:
        return [
            self.decide_failure(
                now_ms,
                Failure.unpack(failures[at : at + FAILURE_WORDS], each[i] if each else NO_NAMES),
            )
            for i, at in enumerate(range(0, len(failures) - FAILURE_WORDS + 1, FAILURE_WORDS))
        ]

    def decide(self, now_ms: int, failures: List[int]) -> List[int]:
        return self.decide_all(now_ms, failures, [])

    def decide_one(self, now_ms: int, failure: Tuple[int, ...]) -> int:
        return self.decide_failure(now_ms, Failure.unpack(failure))


class NamedRetry:
    """The `named-retry` export: `POLICY` (a RetryPolicy) called with each task's names."""

    POLICY: ClassVar[type]

    def reads_names(self) -> bool:
        return True

    def decide(self, now_ms: int, failures: List[int], names, which) -> List[int]:
        return self.POLICY().decide_all(now_ms, failures, _batch_names(names, which))

    def decide_one(self, now_ms: int, failure: Tuple[int, ...], names) -> int:
        return self.POLICY().decide_failure(now_ms, Failure.unpack(failure, Names.of(names)))


class AgingPolicy(_Configured):
    """Implement `promote(now_ms, task) -> Optional[int]` (the bucket to move to, or None)."""

    def promote(self, now_ms: int, task: Task) -> Optional[int]:
        raise NotImplementedError

    def age_all(self, now_ms: int, waiting: List[int], each: List[Names], promotion):
        from wit_world.imports.types import Bucket

        promotions = []
        for index, at in enumerate(range(0, len(waiting) - VIEW_WORDS + 1, VIEW_WORDS)):
            names = each[index] if each else NO_NAMES
            to = self.promote(now_ms, Task.unpack(waiting[at : at + VIEW_WORDS], names))
            if to is not None:
                promotions.append(promotion(index, Bucket(to)))
        return promotions

    def age(self, now_ms: int, waiting: List[int]):
        from wit_world.exports.aging import Promotion

        return self.age_all(now_ms, waiting, [], Promotion)

    def age_one(self, now_ms: int, task: Tuple[int, ...]):
        from wit_world.imports.types import Bucket

        to = self.promote(now_ms, Task.unpack(task))
        return None if to is None else Bucket(to)


class NamedAging:
    """The `named-aging` export: `POLICY` (an AgingPolicy) called with each task's names."""

    POLICY: ClassVar[type]

    def reads_names(self) -> bool:
        return True

    def age(self, now_ms: int, waiting: List[int], names, which):
        from wit_world.exports.named_aging import Promotion

        return self.POLICY().age_all(now_ms, waiting, _batch_names(names, which), Promotion)

    def age_one(self, now_ms: int, task: Tuple[int, ...], names):
        from wit_world.imports.types import Bucket

        to = self.POLICY().promote(now_ms, Task.unpack(task, Names.of(names)))
        return None if to is None else Bucket(to)


@dataclass(frozen=True)
class Layout:
    """The collection a split's query searches: its shards (0 to `shards` - 1; 0 from a host
    that gives no layout) and those with a live worker now."""

    collection: str
    dim: int
    shards: int
    live: Tuple[int, ...]


class Refuse(Exception):
    """Raised by `children` to refuse the split, with the reason the device is told."""


def shard(index: int):
    """A child that searches stored shard `index` whole."""
    return ("shard", index)


def id_range(low: int, high: int):
    """A child that searches ids in [low, high)."""
    return ("id_range", (low, high))


def id_hash(bucket: int, of: int):
    """A child that searches ids whose hash modulo `of` is `bucket`."""
    return ("id_hash", (bucket, of))


def centroids(lists: List[int]):
    """A child that searches the listed IVF lists."""
    return ("centroids", list(lists))


class SplitPolicy(_Configured):
    """Implement `children(vector, k, nprobe, layout) -> [(filter, weight), ...]`, a filter
    being `shard(i)`, `id_range(lo, hi)`, `id_hash(b, of)` or `centroids([...])`; raise
    `Refuse(reason)` to refuse. This class answers 0.1.0's `split` export (with no layout);
    beside it the app declares `class SplitLayout(sp.SplitLayoutPolicy, exports.SplitLayout)`
    with `POLICY` set to its split class, which answers `split-layout`."""

    def children(self, vector: List[float], k: int, nprobe: int, layout: Layout):
        raise NotImplementedError

    def answer(self, module, vector, k: int, nprobe: int, layout: Layout):
        try:
            chosen = self.children(list(vector), k, nprobe, layout)
        except Refuse as why:
            raise Err(str(why))
        cases = {
            "shard": module.ShardFilter_Shard,
            "id_range": module.ShardFilter_IdRange,
            "id_hash": module.ShardFilter_IdHash,
            "centroids": module.ShardFilter_Centroids,
        }
        return [module.Subtask(cases[kind](value), float(weight)) for (kind, value), weight in chosen]

    def split(self, request):
        from wit_world.exports import split as module

        unknown = Layout("", len(request.vector), 0, ())
        return self.answer(module, request.vector, request.k, request.nprobe, unknown)


class SplitLayoutPolicy:
    """The `split-layout` export: the same policy (`POLICY`), told the collection's layout."""

    POLICY: ClassVar[type]

    def split(self, request):
        from wit_world.exports import split_layout as module

        given = request.layout
        layout = Layout(given.collection, given.dim, given.shards, tuple(given.live))
        return self.POLICY().answer(module, request.vector, request.k, request.nprobe, layout)


@dataclass(frozen=True)
class Hit:
    """One hit of a vector search: the id, its distance (smaller is nearer) and, in a merge's
    input, the index of the child that found it."""

    id: int
    distance: float
    child: int = 0


def _f32(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits & _U32))[0]


def _f32_bits(value: float) -> int:
    return struct.unpack("<I", struct.pack("<f", value))[0]


class MergePolicy(_Configured):
    """Implement `merge_hits(k, weights, hits) -> [Hit, ...]`: at most `k` hits, nearest first,
    each id once (ties broken by id). `hits` are the children's, each child's run nearest
    first; `weights[c]` is child c's weight. Raise `Refuse(reason)` to refuse the merge."""

    def merge_hits(self, k: int, weights: List[float], hits: List[Hit]) -> List[Hit]:
        raise NotImplementedError

    def merge(self, k: int, weights: List[float], hits: List[int]) -> List[int]:
        given = [
            Hit(hits[at], _f32(hits[at + 1]), hits[at + 1] >> 32)
            for at in range(0, len(hits) - 1, 2)
        ]
        try:
            chosen = self.merge_hits(k, list(weights), given)
        except Refuse as why:
            raise Err(str(why))
        answer: List[int] = []
        for hit in chosen:
            answer.extend((hit.id, _f32_bits(hit.distance)))
        return answer
