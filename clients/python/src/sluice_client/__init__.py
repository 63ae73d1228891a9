"""A Python client for Sluice: devices submit and wait, GPU services run a `Worker`, operators
manage policies, experiments and tokens. See the package's README."""

from .client import MAX_BATCH, Client
from .errors import (
    AttemptFailed,
    AttemptStopped,
    InvalidInputError,
    PermanentError,
    ProblemError,
    SluiceError,
    TransientError,
    TransportError,
)
from .types import (
    ClaimResponse,
    Event,
    Gpu,
    Heartbeat,
    IssuedToken,
    Lease,
    LeaseGrant,
    LoadedModel,
    PolicyVersion,
    ShardAnnouncement,
    Task,
    TaskRequest,
)
from .worker import Batch, Job, Worker, WorkerStats

__all__ = [
    "MAX_BATCH",
    "AttemptFailed",
    "AttemptStopped",
    "Batch",
    "ClaimResponse",
    "Client",
    "Event",
    "Gpu",
    "Heartbeat",
    "InvalidInputError",
    "IssuedToken",
    "Job",
    "Lease",
    "LeaseGrant",
    "LoadedModel",
    "PermanentError",
    "PolicyVersion",
    "ProblemError",
    "ShardAnnouncement",
    "SluiceError",
    "Task",
    "TaskRequest",
    "TransientError",
    "TransportError",
    "Worker",
    "WorkerStats",
]
