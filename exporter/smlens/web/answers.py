"""The JSON answers of the API, as pydantic models: FastAPI checks each answer against its model and
writes the OpenAPI document from them."""

from __future__ import annotations

from pydantic import BaseModel

READ = ["GET", "HEAD"]  # the methods of every route that only reads


class ErrorAnswer(BaseModel):
    error: str


class Profiling(BaseModel):
    available: bool
    source: str | None
    reason: str | None


class VerdictAnswer(BaseModel):
    code: str
    text: str
    pipe: str | None  # compute_bound: the busiest compute pipe


class InstanceAnswer(BaseModel):
    """A MIG GPU instance; its verdict stands its memory in use for the utilization NVML does not give."""

    gpu_instance: int
    mig_profile: str
    mig_uuids: list[str]
    sm_count: int | None
    memory_held: bool
    verdict: VerdictAnswer
    values: dict[str, float]
    missing: dict[str, str]


class GpuAnswer(BaseModel):
    index: int
    uuid: str
    model: str
    pci_bus_id: str
    sm_count: int | None
    up: bool
    profiling: Profiling
    verdict: VerdictAnswer | None
    memory_held: bool  # a workload holds memory on it (more in use than a GPU without processes)
    values: dict[str, float]
    missing: dict[str, str]
    sources: list[str]
    instances: list[InstanceAnswer]


class BackendAnswer(BaseModel):
    name: str
    up: bool
    last_duration_seconds: float
    errors: dict[str, int]


class GpusAnswer(BaseModel):
    hostname: str
    sequence: int
    taken_at: float
    age_seconds: float
    interval_seconds: float
    gpus: list[GpuAnswer]
    backends: list[BackendAnswer]


class HistoryGpu(GpuAnswer):
    owners: list[dict[str, str]]
    verdict_since: float
    timeline: dict[str, list[float | str | None]]


class HistoryAnswer(BaseModel):
    version: str
    hostname: str
    sequence: int
    taken_at: float
    age_seconds: float
    interval_seconds: float
    window_seconds: float
    reset: bool
    more: bool
    series: list[str]
    sequences: list[int]
    times: list[float]
    gpus: list[HistoryGpu]
    reasons: dict[str, str]  # each absence reason of these GPUs and instances, in words


class ProfilingState(BaseModel):
    paused: bool


class ProfilingRefusal(BaseModel):
    error: str
    reason: str
