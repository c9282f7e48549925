"""The HTTP face of the exporter. Every handler answers from the latest pre-rendered snapshot;
none of them calls NVML, DCGM or the kubelet."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import yaml

from smlens import __version__
from smlens import names as n
from smlens.exposition import Exposition, live_registry, render_live
from smlens.model import GpuState, Snapshot
from smlens.routing import JSONResponse, PlainTextResponse, Request, Response, Route, Router, off_loop
from smlens.status.history import History
from smlens.status.page import status_router
from smlens.thresholds import Thresholds
from smlens.verdict import latest as verdict_of


class App(Router):
    """The exporter's application: smlens' own routes (Starlette and what it imported cost serve 1.3-2.1 MiB
    of RSS, FastAPI 7.7 MiB more: docs/performance.md, "Memory") and their OpenAPI document, made from the
    YAML after ``---`` in each handler's docstring. The document is not served; the tests fuzz with it."""

    def include_router(self, router: Router) -> None:
        self.routes.extend(router.routes)

    def openapi(self) -> dict[str, Any]:
        paths: dict[str, dict[str, Any]] = {}
        for route in self.routes:
            operation = yaml.safe_load((route.endpoint.__doc__ or "").split("---")[-1])
            if isinstance(operation, dict):
                for method in route.methods:
                    if method != "HEAD":
                        paths.setdefault(route.path, {})[method.lower()] = operation
        return {"openapi": "3.0.3", "info": {"title": "smlens", "version": __version__}, "paths": paths}


class Sampling(Protocol):
    """What serving needs of the sampler (smlens.sampler.Sampler)."""

    @property
    def interval(self) -> float: ...

    def publish(self) -> object:
        """Decode and publish the ticks captured so far."""

    def progress(self) -> tuple[int, float]:
        """Ticks captured so far, and the seconds since the latest."""


class Publisher:
    """Holds the latest exposition; the sampler's listener swaps it in for each published tick. ``live``
    holds the metrics rendered at each scrape instead."""

    def __init__(self) -> None:
        self.current: Exposition | None = None
        self.live = live_registry()

    def publish(self, snapshot: Snapshot) -> None:
        self.current = Exposition(snapshot)


def _accepts(header: str, token: str) -> bool:
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
    verdict = verdict_of(thresholds, gpu)
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
        "verdict": None if verdict is None else {"code": verdict.code, "text": verdict.text},
        "values": dict(gpu.gauges),
        "missing": dict(gpu.missing),
        "sources": list(gpu.sources),
        "instances": [  # MIG GPU instances; no verdict: NVML gives no utilization per instance
            {
                "gpu_instance": i.instance.gpu_instance,
                "mig_profile": i.instance.profile,
                "mig_uuids": list(i.instance.mig_uuids),
                "sm_count": i.instance.sm_count,
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
    sampling: Sampling | None = None,
) -> App:
    """``history`` is the ring the sampler feeds for the status page at ``/``. With ``sampling``, the
    answers made of data (/metrics, /api/v1/gpus, /api/v1/history) first publish the ticks the sampler
    captured before the request, off the event loop, and readiness follows the captures; the probes
    publish nothing, so that ticks keep waiting for the next scrape and are decoded in batches."""
    history = History(thresholds) if history is None else history

    async def fresh() -> None:
        if sampling is not None:
            await off_loop(sampling.publish)

    def not_ready() -> str | None:
        if sampling is None:
            current = publisher.current
            ticks, age = (0, 0.0) if current is None else (current.snapshot.sequence, current.age())
            interval = 0.0 if current is None else current.snapshot.interval_seconds
        else:
            (ticks, age), interval = sampling.progress(), sampling.interval
        if ticks < 2:  # the first tick only primes the counters
            return "no complete sample yet"
        limit = max(n.STALE_INTERVALS * interval, n.STALE_MIN_SECONDS)
        if age > limit:
            return f"latest sample is {age:.1f} s old (limit {limit:.1f} s): sampling stalled"
        return None

    async def metrics(request: Request) -> Response:
        """The latest snapshot in Prometheus' text format or OpenMetrics (Accept), gzipped on request.
        ---
        responses:
          200: {description: the metrics}
          503: {description: no complete sample yet}
        """
        await fresh()
        current = publisher.current
        if current is None:
            return PlainTextResponse("no complete sample yet\n", status_code=503)
        openmetrics = _accepts(request.headers.get("accept", ""), "application/openmetrics-text")
        reply = current.respond(
            openmetrics=openmetrics,
            gzip=_accepts(request.headers.get("accept-encoding", ""), "gzip"),
            live=render_live(publisher.live, openmetrics),
        )
        headers = (
            {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"}
            if reply.gzipped
            else {"Vary": "Accept-Encoding"}
        )
        return Response(reply.body, media_type=reply.content_type, headers=headers)

    async def healthy(request: Request) -> Response:
        """Liveness: is the sampler thread running?
        ---
        responses:
          200: {description: it is}
          503: {description: it is not}
        """
        if not sampler_alive():
            return PlainTextResponse("sampler thread is not running\n", status_code=503)
        return PlainTextResponse("OK\n")

    async def ready(request: Request) -> Response:
        """Readiness: is the latest snapshot complete and fresh?
        ---
        responses:
          200: {description: it is}
          503: {description: the reason in one sentence}
        """
        reason = not_ready()
        if reason is not None:
            return PlainTextResponse(reason + "\n", status_code=503)
        return PlainTextResponse("OK\n")

    async def gpus(request: Request) -> Response:
        """Every GPU's latest values, verdict and MIG instances, as JSON.
        ---
        parameters:
          - name: gpu
            in: query
            required: false
            description: only the GPU with this index or UUID
            schema: {type: string}
        responses:
          200: {description: the GPUs}
          404: {description: no such GPU on this node}
          503: {description: no complete sample yet}
        """
        await fresh()
        gpu = request.query_params.get("gpu")
        current = publisher.current
        if current is None:
            return JSONResponse({"error": "no complete sample yet"}, status_code=503)
        snap = current.snapshot
        selected = [g for g in snap.gpus if gpu is None or gpu in (str(g.identity.index), g.identity.uuid)]
        if gpu is not None and not selected:
            return JSONResponse({"error": f"no GPU with index or uuid {gpu!r} on this node"}, status_code=404)
        return JSONResponse(
            {
                "hostname": snap.hostname,
                "sequence": snap.sequence,
                "taken_at": snap.taken_at,
                "age_seconds": current.age(),
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
        )

    app = App(
        routes=[
            Route("/metrics", metrics, methods=["GET"]),
            Route("/-/healthy", healthy, methods=["GET"]),
            Route("/-/ready", ready, methods=["GET"]),
            Route("/api/v1/gpus", gpus, methods=["GET"]),
        ]
    )
    publish = (lambda: None) if sampling is None else sampling.publish
    app.include_router(status_router(history, lambda gpu: gpu_json(gpu, thresholds), publish))
    return app
