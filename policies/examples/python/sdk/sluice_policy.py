"""Sluice's policy SDK for Python: the packed layouts of `wit/policy.wit` as plain classes, the
`name=value` config format with typed errors, and one base class per kind that turns a single
per-task method into both the batch export and its `-one` twin, so the two always agree.

A policy subclasses the kind's base class beside the generated export protocol:

    from wit_world import exports
    import sluice_policy as sp

    class Retry(sp.RetryPolicy, exports.Retry):
        SETTINGS = {"initial_delay_ms": 300_000}
        def decide_failure(self, now_ms, failure): ...

Build it with `componentize-py -d wit -w retry-policy componentize app -p . -p sdk -o x.wasm`
(see policies/README.md). Every decision must be a pure function of its arguments: the host
freezes the clock at the call's `now_ms` and gives seeded random bits, so `time` and `random`
replay, but the arguments are where a decision's inputs belong.
"""

from dataclasses import dataclass
from typing import ClassVar, Dict, List, Optional, Tuple

from componentize_py_types import Err

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
class Task:
    """A task view: 6 packed words."""

    seq: int
    tenant: int
    kind: int
    created_ms: int
    bucket_since_ms: int
    est_exec_ms: int
    attempt: int
    bucket: int
    submitted_bucket: int

    @staticmethod
    def unpack(words) -> "Task":
        seq, tenant_kind, created, since, est, packed = words
        return Task(
            seq=seq,
            tenant=tenant_kind >> 32,
            kind=tenant_kind & _U32,
            created_ms=created,
            bucket_since_ms=since,
            est_exec_ms=est,
            attempt=packed >> 32,
            bucket=(packed >> 8) & 0xFF,
            submitted_bucket=packed & 0xFF,
        )


@dataclass(frozen=True)
class Failure:
    """A failed attempt: the task view, its error class, its attempt budget and random bits."""

    task: Task
    error_class: int
    max_attempts: int
    random: int

    @staticmethod
    def unpack(words) -> "Failure":
        class_max = words[6]
        return Failure(Task.unpack(words[0:6]), class_max >> 32, class_max & _U32, words[7])


def retry_after_ms(delay_ms: int) -> int:
    """A retry decision: wait `delay_ms`, then run again."""
    if not 0 <= delay_ms < _DEAD:
        raise ValueError(f"delay {delay_ms} ms out of range")
    return delay_ms


def dead(reason: int) -> int:
    """A retry decision: the task is dead for `reason` (one of the DEAD_* codes)."""
    return _DEAD | reason


def parse_config(config: bytes, defaults: Dict[str, int]) -> Dict[str, int]:
    """`name=value` lines (blank lines and `#` comments skipped) over integer `defaults`; an
    unknown name, a repeated name or a value that is not a non-negative integer is refused."""
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
        if not value.isdigit():
            raise ConfigError(f"{name}: {value!r} is not a non-negative integer")
        seen.add(name)
        settings[name] = int(value)
    return settings


class _Configured:
    """Parses `SETTINGS` at init and hands them to `configure`, which may refuse them."""

    SETTINGS: ClassVar[Dict[str, int]] = {}
    settings: Dict[str, int] = {}

    def init(self, config: bytes) -> None:
        try:
            settings = parse_config(config, self.SETTINGS)
            self.configure(settings)
        except ConfigError as error:
            raise Err(str(error))
        # componentize-py may build a fresh object for each call, so settings live on the class.
        type(self).settings = settings

    def configure(self, settings: Dict[str, int]) -> None:
        """Checks settings beyond their type; raise ConfigError to refuse them."""


class RetryPolicy(_Configured):
    """Implement `decide_failure(now_ms, failure) -> int` (a `retry_after_ms` or `dead`)."""

    def decide_failure(self, now_ms: int, failure: Failure) -> int:
        raise NotImplementedError

    def decide(self, now_ms: int, failures: List[int]) -> List[int]:
        return [
            self.decide_failure(now_ms, Failure.unpack(failures[at : at + FAILURE_WORDS]))
            for at in range(0, len(failures) - FAILURE_WORDS + 1, FAILURE_WORDS)
        ]

    def decide_one(self, now_ms: int, failure: Tuple[int, ...]) -> int:
        return self.decide_failure(now_ms, Failure.unpack(failure))


class AgingPolicy(_Configured):
    """Implement `promote(now_ms, task) -> Optional[int]` (the bucket to move to, or None)."""

    def promote(self, now_ms: int, task: Task) -> Optional[int]:
        raise NotImplementedError

    def age(self, now_ms: int, waiting: List[int]):
        from wit_world.exports.aging import Promotion
        from wit_world.imports.types import Bucket

        promotions = []
        for index, at in enumerate(range(0, len(waiting) - VIEW_WORDS + 1, VIEW_WORDS)):
            to = self.promote(now_ms, Task.unpack(waiting[at : at + VIEW_WORDS]))
            if to is not None:
                promotions.append(Promotion(index, Bucket(to)))
        return promotions

    def age_one(self, now_ms: int, task: Tuple[int, ...]):
        from wit_world.imports.types import Bucket

        to = self.promote(now_ms, Task.unpack(task))
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
