"""The exporter's FastAPI application. Every handler answers from what the sampler's thread last published
(:class:`~smlens.exposition.rendered.Publisher`) or recorded (:class:`~smlens.web.status.history.History`);
none of them calls the sampler, a backend, NVML, DCGM or the kubelet, and none decodes or renders a
snapshot: /metrics joins the pre-rendered body with the few families it renders per scrape."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from prometheus_client.registry import CollectorRegistry

from smlens import __version__
from smlens import names as n
from smlens.exposition.live import SnapshotAge, live_registry, render_live
from smlens.exposition.rendered import Publisher
from smlens.model import GpuState
from smlens.verdicts.judge import holds_memory, latest_instance
from smlens.verdicts.judge import latest as verdict_of
from smlens.verdicts.thresholds import Thresholds
from smlens.web.answers import READ, ErrorAnswer, GpusAnswer
from smlens.web.status.history import History
from smlens.web.status.page import STATIC_DIR, StaticAssets, status_router

NO_SAMPLE = "no complete sample yet"


def accepts(header: str, token: str) -> bool:
    """Does an Accept or Accept-Encoding header admit ``token`` (with q > 0)?"""
    for part in header.split(","):
        name, *params = (field.strip() for field in part.split(";"))
        if name.lower() != token:
            continue
        for param in params:
            key, _, value = param.partition("=")
            if key.strip().lower() == "q":
                try:
                    return float(value) > 0
                except ValueError:
                    return False
        return True
    return False


def gpu_json(gpu: GpuState, thresholds: Thresholds) -> dict[str, Any]:
    ident = gpu.identity
    return {
        "index": ident.index,
        "uuid": ident.uuid,
        "model": ident.name,
        "pci_bus_id": ident.pci_bus_id,
        "sm_count": ident.sm_count,
        "up": gpu.up,
        "profiling": {
            "available": gpu.profiling_available,
            "source": gpu.profiling_source,
            "reason": gpu.profiling_reason,
        },
        "verdict": None if (verdict := verdict_of(thresholds, gpu)) is None else verdict.as_json(),
        "memory_held": holds_memory(gpu.gauges.get(n.MEMORY_USED_BYTES)),
        "values": dict(gpu.gauges),
        "missing": dict(gpu.missing),
        "sources": list(gpu.sources),
        "instances": [
            {
                "gpu_instance": i.instance.gpu_instance,
                "mig_profile": i.instance.profile,
                "mig_uuids": list(i.instance.mig_uuids),
                "sm_count": i.instance.sm_count,
                "memory_held": holds_memory(i.gauges.get(n.MEMORY_USED_BYTES)),
                "verdict": latest_instance(thresholds, i).as_json(),
                "values": dict(i.gauges),
                "missing": dict(i.missing),
            }
            for i in gpu.instances
        ],
    }


def create_app(
    publisher: Publisher,
    thresholds: Thresholds,
    sampler_alive: Callable[[], bool],
    history: History | None = None,
    live: CollectorRegistry | None = None,
    wall: Callable[[], float] = time.time,
) -> FastAPI:
    """``history`` is the ring the sampler feeds for the status page at ``/``; ``live`` holds the families
    rendered per scrape (:mod:`smlens.exposition.live`), by default the process' and the snapshot's age."""
    history = History(thresholds) if history is None else history
    if live is None:
        live = live_registry(
            SnapshotAge(lambda: None if publisher.current is None else publisher.current.snapshot)
        )
    # No interactive docs or OpenAPI route: an exporter serves metrics; the document is app.openapi().
    app = FastAPI(
        title="smlens",
        version=__version__,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,  # Starlette's redirect would write the request's Host header back
    )

    def not_ready() -> str | None:
        current = publisher.current
        if current is None or current.snapshot.sequence < 2:  # the first tick only primes the counters
            return NO_SAMPLE
        snapshot = current.snapshot
        age = max(wall() - snapshot.taken_at, 0.0)
        limit = max(n.STALE_INTERVALS * snapshot.interval_seconds, n.STALE_MIN_SECONDS)
        if age > limit:
            return f"latest sample is {age:.1f} s old (limit {limit:.1f} s): sampling stalled"
        return None

    @app.api_route(
        "/metrics",
        methods=READ,
        response_class=Response,
        responses={200: {"description": "the metrics"}, 503: {"description": NO_SAMPLE}},
    )
    async def metrics(request: Request) -> Response:
        """The latest snapshot in Prometheus' text format or OpenMetrics (Accept), gzipped on request."""
        current = publisher.current
        if current is None:
            return PlainTextResponse(NO_SAMPLE + "\n", status_code=503)
        asked = accepts(request.headers.get("accept", ""), "application/openmetrics-text")
        publisher.asked(asked)
        openmetrics = current.served(asked)
        answer = current.answer(
            openmetrics=openmetrics,
            gzip=accepts(request.headers.get("accept-encoding", ""), "gzip"),
            live=render_live(live, openmetrics),
        )
        headers = {"Vary": "Accept-Encoding"}
        if answer.gzipped:
            headers["Content-Encoding"] = "gzip"
        return Response(answer.body, media_type=answer.content_type, headers=headers)

    @app.api_route(
        "/-/healthy",
        methods=READ,
        response_class=PlainTextResponse,
        responses={503: {"description": "the sampler thread is not running"}},
    )
    async def healthy() -> PlainTextResponse:
        """Liveness: is the sampler thread running?"""
        if not sampler_alive():
            return PlainTextResponse("sampler thread is not running\n", status_code=503)
        return PlainTextResponse("OK\n")

    @app.api_route(
        "/-/ready",
        methods=READ,
        response_class=PlainTextResponse,
        responses={503: {"description": "the reason in one sentence"}},
    )
    async def ready() -> PlainTextResponse:
        """Readiness: is the latest snapshot complete and fresh?"""
        reason = not_ready()
        if reason is not None:
            return PlainTextResponse(reason + "\n", status_code=503)
        return PlainTextResponse("OK\n")

    @app.api_route(
        "/api/v1/gpus",
        methods=READ,
        response_model=GpusAnswer,
        responses={404: {"model": ErrorAnswer}, 503: {"model": ErrorAnswer}},
    )
    async def gpus(gpu: str | None = None) -> Any:
        """Every GPU's latest values, verdict and MIG instances; with ``gpu``, only the GPU of that index
        or UUID."""
        current = publisher.current
        if current is None:
            return JSONResponse({"error": NO_SAMPLE}, status_code=503)
        snap = current.snapshot
        selected = [g for g in snap.gpus if gpu is None or gpu in (str(g.identity.index), g.identity.uuid)]
        if gpu is not None and not selected:
            return JSONResponse({"error": f"no GPU with index or uuid {gpu!r} on this node"}, status_code=404)
        return {
            "hostname": snap.hostname,
            "sequence": snap.sequence,
            "taken_at": snap.taken_at,
            "age_seconds": max(wall() - snap.taken_at, 0.0),
            "interval_seconds": snap.interval_seconds,
            "gpus": [gpu_json(g, thresholds) for g in selected],
            "backends": [
                {
                    "name": b.name,
                    "up": b.up,
                    "last_duration_seconds": b.last_duration_seconds,
                    "errors": dict(b.errors_total),
                }
                for b in snap.backends
            ],
        }

    app.include_router(status_router(history, lambda gpu: gpu_json(gpu, thresholds)))
    app.mount("/static", StaticAssets(directory=STATIC_DIR), name="static")
    return app
