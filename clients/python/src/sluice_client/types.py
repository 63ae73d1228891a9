"""The records the API sends and takes, as typed dataclasses.

Each names where the server's OpenAPI document (`GET /v1/openapi.json`) defines it
(`OPENAPI`: a path of keys from the document's root to its schema), and `schema.check` holds
every field here to that schema, so a field renamed on the server fails the package's tests.
A record read from the server keeps fields this version does not know in `extra`: a newer
server can add fields without breaking an older client.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar, Union

T = TypeVar("T", bound="Record")

#: A JSON value as the API sends it.
Json = Any


def _json_name(f: dataclasses.Field) -> str:
    return f.metadata.get("json", f.name)


def _strip_optional(hint: Any) -> Any:
    if typing.get_origin(hint) in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def _decode(hint: Any, value: Any) -> Any:
    """`value` (JSON) as `hint` says: records within records and lists are decoded too."""
    if value is None:
        return None
    hint = _strip_optional(hint)
    if isinstance(hint, type) and issubclass(hint, Record):
        return hint.from_json(value)
    if typing.get_origin(hint) is list:
        (item,) = typing.get_args(hint)
        return [_decode(item, v) for v in value]
    return value


def _encode(value: Any) -> Any:
    if isinstance(value, Record):
        return value.to_json()
    if isinstance(value, list):
        return [_encode(v) for v in value]
    return value


@dataclass
class Record:
    """A JSON object of the API: fields by their JSON names, unknown ones in `extra`."""

    #: Where the OpenAPI document defines this record (see the module's comment).
    OPENAPI: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_json(cls: type[T], data: dict[str, Any]) -> T:
        hints = typing.get_type_hints(cls)
        known = {}
        names = set()
        for f in dataclasses.fields(cls):
            if f.name == "extra":
                continue
            name = _json_name(f)
            names.add(name)
            if name in data:
                known[f.name] = _decode(hints[f.name], data[name])
        record = cls(**known)
        record.extra = {k: v for k, v in data.items() if k not in names}
        return record

    def to_json(self) -> dict[str, Any]:
        """The fields that are set (not None), by their JSON names."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if value is not None:
                out[_json_name(f)] = _encode(value)
        out.update(self.extra)
        return out

    @classmethod
    def json_fields(cls) -> dict[str, Any]:
        """Each field's JSON name and its type."""
        hints = typing.get_type_hints(cls)
        return {
            _json_name(f): hints[f.name] for f in dataclasses.fields(cls) if f.name != "extra"
        }


_PATHS = "paths"
_JSON = "application/json"


def _response(path: str, method: str, status: str = "200") -> tuple[str, ...]:
    return (_PATHS, path, method, "responses", status, "content", _JSON, "schema")


def _request(path: str, method: str) -> tuple[str, ...]:
    return (_PATHS, path, method, "requestBody", "content", _JSON, "schema")


@dataclass
class Lease(Record):
    """The current (or last) attempt's lease, as a task shows it."""

    OPENAPI = _response("/v1/tasks/{id}", "get") + ("properties", "lease")

    worker: str = ""
    attempt: int = 0
    expires_at_ms: int = 0
    attempt_ends_at_ms: int = 0
    claimed_at_ms: int | None = None
    claim_id: str | None = None
    started_at_ms: int | None = None
    gpu: int | None = None
    ended_at_ms: int | None = None
    stopped_at_ms: int | None = None
    revoked_at_ms: int | None = None
    revoked_for: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Task(Record):
    """A task as the server keeps it."""

    OPENAPI = _response("/v1/tasks/{id}", "get")

    id: str = ""
    kind: str = ""
    state: str = ""
    priority: str = "normal"
    bucket: str = "normal"
    key: str | None = None
    device: str = ""
    tenant: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    attempt: int = 0
    max_attempts: int = 0
    est_exec_ms: int = 0
    deadline_ms: int | None = None
    #: `gpu_memory_mb`, `model` and `batch_key`, as submitted.
    resources: dict[str, Any] = field(default_factory=dict)
    payload: Json = None
    result: Json = None
    error: dict[str, Any] | None = None
    lease: Lease | None = None
    parent: str | None = None
    created_at_ms: int = 0
    updated_at_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    #: The states a task never leaves.
    TERMINAL: ClassVar[frozenset[str]] = frozenset(
        {"completed", "failed", "dead", "cancelled", "timed_out"}
    )

    @property
    def ended(self) -> bool:
        return self.state in self.TERMINAL


@dataclass
class TaskRequest(Record):
    """What a device submits. Only `kind` is required; the server fills in the rest."""

    OPENAPI = _request("/v1/tasks", "post")

    kind: str = ""
    key: str | None = None
    priority: str | None = None
    device: str | None = None
    tenant: str | None = None
    labels: dict[str, str] | None = None
    est_exec_ms: int | None = None
    deadline_ms: int | None = None
    max_attempts: int | None = None
    payload: Json = None
    callback_url: str | None = None
    resources: dict[str, Any] | None = None
    preemptible: bool | None = None
    concurrency_key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Event(Record):
    """One change of a task's state in the event log."""

    OPENAPI = _response("/v1/tasks/{id}/events", "get") + ("properties", "events", "items")

    seq: int = 0
    task_id: str = ""
    from_state: str | None = field(default=None, metadata={"json": "from"})
    to_state: str = field(default="", metadata={"json": "to"})
    actor: str = ""
    at_ms: int = 0
    detail: Json = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class LeaseGrant(Record):
    """A task a claim leased to this worker, with the token its reports carry."""

    OPENAPI = _response("/v1/workers/{id}/claim", "post") + ("properties", "leases", "items")

    task: Task = field(default_factory=Task)
    payload: Json = None
    attempt: int = 0
    lease_token: str = ""
    lease_expires_at_ms: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClaimRefusal(Record):
    """Why a claim got nothing (`at-capacity`, `breaker-open`, `stale-heartbeat`, ...)."""

    OPENAPI = _response("/v1/workers/{id}/claim", "post") + ("properties", "reason")

    code: str = ""
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClaimResponse(Record):
    OPENAPI = _response("/v1/workers/{id}/claim", "post")

    leases: list[LeaseGrant] = field(default_factory=list)
    reason: ClaimRefusal | None = None
    waited_for_work_us: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Gpu(Record):
    """One GPU a worker announces."""

    OPENAPI = _request("/v1/workers/{id}/heartbeat", "post") + ("properties", "gpus", "items")

    memory_mb: int = 0
    model: str | None = None
    free: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoadedModel(Record):
    """A model held in a GPU's memory."""

    OPENAPI = _request("/v1/workers/{id}/heartbeat", "post") + (
        "properties",
        "loaded_models",
        "items",
    )

    name: str = ""
    gpu: int = 0
    memory_mb: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ShardAnnouncement(Record):
    """The vector shard a shard worker holds."""

    OPENAPI = _request("/v1/workers/{id}/heartbeat", "post") + ("properties", "vectors")

    collection: str = "default"
    shard: int = 0
    shards: int = 1
    dim: int = 0
    vectors: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Heartbeat(Record):
    """What a worker says of itself every few seconds."""

    OPENAPI = _request("/v1/workers/{id}/heartbeat", "post")

    gpus: list[Gpu] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    kinds: list[str] = field(default_factory=list)
    max_concurrency: int = 1
    queue_depth: int = 0
    loaded_models: list[LoadedModel] | None = None
    vectors: ShardAnnouncement | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class PolicyVersion(Record):
    """A stored policy version, as an upload answers it."""

    OPENAPI = _response("/v1/policies/{kind}", "put", "201")

    kind: str = ""
    version: int = 0
    sha256: str = ""
    config: str = ""
    size_bytes: int = 0
    uploaded_at_ms: int = 0
    created: bool = True
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class IssuedToken(Record):
    """A token just issued: `token` is shown this once."""

    OPENAPI = _response("/v1/tokens", "post", "201")

    token: str = ""
    id: str = ""
    role: str = ""
    device: str | None = None
    tenant: str | None = None
    worker: str | None = None
    expires_at_ms: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


#: Every record of this module, for `schema.check`.
RECORDS: tuple[type[Record], ...] = (
    Lease,
    Task,
    TaskRequest,
    Event,
    LeaseGrant,
    ClaimRefusal,
    ClaimResponse,
    Gpu,
    LoadedModel,
    ShardAnnouncement,
    Heartbeat,
    PolicyVersion,
    IssuedToken,
)
