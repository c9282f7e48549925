"""The status page at ``/`` and the history it polls, ``/api/v1/history``.

The page is three files shipped with the package (static/): no CDN, font or script from elsewhere,
and a Content-Security-Policy that lets the browser load nothing but them and this server's JSON.
Every answer comes from the :class:`~smlens.status.history.History` ring; none touches a backend.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from importlib import resources
from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response

from smlens import __version__
from smlens.model import GpuState
from smlens.status.history import MAX_VALUES_PER_ANSWER, SERIES, History, owners

# Same-origin only: the page must work on an air-gapped cluster and must not leak node data.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
STATIC = {
    "status.css": "text/css; charset=utf-8",
    "status.js": "text/javascript; charset=utf-8",
}

Describe = Callable[[GpuState], dict[str, Any]]


def _asset(name: str) -> bytes:
    return (resources.files("smlens.status") / "static" / name).read_bytes()


def status_router(history: History, describe: Describe) -> APIRouter:
    """Routes of the page; ``describe`` is /api/v1/gpus' view of one GPU, so both agree on verdicts."""
    router = APIRouter()
    page = _asset("index.html")
    assets = {name: _asset(name) for name in STATIC}
    # Other headers (X-Content-Type-Options, ...) come from the web config's http_server_config.headers.
    headers = {"Content-Security-Policy": CSP, "Cache-Control": "no-cache"}

    @router.get("/")
    async def status_page() -> Response:
        return Response(page, media_type="text/html; charset=utf-8", headers=headers)

    @router.get("/static/{name}")
    async def static(name: str) -> Response:
        if name not in assets:
            return Response("no such static file\n", status_code=404, media_type="text/plain")
        return Response(assets[name], media_type=STATIC[name], headers=headers)

    # A plain function: FastAPI runs it on its thread pool, so a full window never blocks /metrics.
    @router.get("/api/v1/history")
    def history_json(
        after: int | None = Query(None, ge=0, description="sequence of the newest point the caller holds"),
    ) -> Response:
        window = history.window(after, MAX_VALUES_PER_ANSWER)
        if window is None:
            return JSONResponse({"error": "no complete sample yet"}, status_code=503)
        snap = window.snapshot
        return JSONResponse(
            {
                "version": __version__,
                "hostname": snap.hostname,
                "sequence": snap.sequence,
                "taken_at": snap.taken_at,
                "age_seconds": max(time.time() - snap.taken_at, 0.0),
                "interval_seconds": snap.interval_seconds,
                "window_seconds": history.window_seconds,
                "reset": window.reset,
                "more": window.more,
                "series": list(SERIES),
                "sequences": window.sequences,
                "times": window.times,
                "gpus": [
                    {
                        **describe(gpu),
                        "owners": owners(snap, gpu),
                        "verdict_since": since,
                        "timeline": {**series, "verdict": verdicts},
                    }
                    for gpu, series, verdicts, since in zip(
                        snap.gpus, window.series, window.verdicts, window.verdict_since, strict=True
                    )
                ],
            },
            headers={"Cache-Control": "no-store"},
        )

    return router
