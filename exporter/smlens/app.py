"""The HTTP face of the exporter. Every handler answers from the latest pre-rendered snapshot;
none of them calls NVML, DCGM or the kubelet."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import yaml

from smlens import __version__
from smlens import names as n
from smlens.asgi import Receive, Scope, Send
from smlens.exposition import Exposition, live_registry, render_live
from smlens.model import GpuState, Snapshot
from smlens.routing import JSONResponse, PlainTextResponse, Request, Response, Route, Router
from smlens.status.history import History
from smlens.status.page import status_router
from smlens.thresholds import Thresholds
from smlens.verdict import latest as verdict_of

log = logging.getLogger(__name__)


class App(Router):
    """The exporter's application: smlens' own routes (Starlette and what it imported cost serve 1.3-2.1 MiB
    of RSS, FastAPI 7.7 MiB more: docs/performance.md, "Memory") and their OpenAPI document, made from the
    YAML after ``---`` in each handler's docstring. The document is not served; the tests fuzz with it.

    ``refresh`` runs before every request: the sampler's ``publish``, so that an answer includes every tick
    captured before it (smlens.sampler)."""

    def __init__(self, routes: Iterable[Route] = (), refresh: Callable[[], object] = lambda: None) -> None:
        super().__init__(routes)
        self.refresh = refresh

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            self.refresh()
        except Exception:  # a failing listener: answer from what was published, as before the request
            log.exception("publishing the captured ticks failed")
        await super().__call__(scope, receive, send)

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


class Publisher:
    """Holds the latest exposition; the sampler's listener swaps it in once per tick. ``live`` holds the
    metrics rendered at each scrape instead."""

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
    refresh: Callable[[], object] = lambda: None,
) -> App:
    """``history`` is the ring the sampler feeds for the status page at ``/``; ``refresh`` publishes the
    ticks the sampler has captured but not yet published (``Sampler.publish``)."""
    history = History(thresholds) if history is None else history

    def not_ready() -> str | None:
        current = publisher.current
        if current is None or current.snapshot.sequence < 2:  # the first tick only primes the counters
            return "no complete sample yet"
        limit = max(n.STALE_INTERVALS * current.snapshot.interval_seconds, n.STALE_MIN_SECONDS)
        if current.age() > limit:
            return f"latest snapshot is {current.age():.1f} s old (limit {limit:.1f} s): sampling stalled"
        return None

    async def metrics(request: Request) -> Response:
        """The latest snapshot in Prometheus' text format or OpenMetrics (Accept), gzipped on request.
        ---
        responses:
          200: {description: the metrics}
          503: {description: no complete sample yet}
        """
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
        ],
        refresh=refresh,
    )
    app.include_router(status_router(history, lambda gpu: gpu_json(gpu, thresholds)))
    return app
