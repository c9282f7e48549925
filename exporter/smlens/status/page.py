"""The status page at ``/`` and the history it polls, ``/api/v1/history``.

The page is three files shipped with the package (static/): no CDN, font or script from elsewhere,
and a Content-Security-Policy that lets the browser load nothing but them and this server's JSON.
Every answer comes from the :class:`~smlens.status.history.History` ring; none touches a backend.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smlens import __version__
from smlens.model import GpuState
from smlens.routing import JSONResponse, Request, Response, Route, Router
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
    return (Path(__file__).parent / "static" / name).read_bytes()  # as thresholds.load reads its file


def _sequence(value: str | None) -> int | None:
    """``after`` as given: absent, or a sequence number (decimal digits); anything else is ValueError."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()):
        raise ValueError(value)
    digits = value.lstrip("0")
    # int() refuses numbers over 4,300 digits; one that long is past every sequence, as a 20-digit one is.
    return int(digits or "0") if len(digits) <= 20 else sys.maxsize


def status_router(
    history: History, describe: Describe, publish: Callable[[], object] = lambda: None
) -> Router:
    """Routes of the page; ``describe`` is /api/v1/gpus' view of one GPU, so both agree on verdicts;
    ``publish`` publishes the ticks the sampler captured before a request for the timelines."""
    page = _asset("index.html")
    assets = {name: _asset(name) for name in STATIC}
    # Other headers (X-Content-Type-Options, ...) come from the web config's http_server_config.headers.
    headers = {"Content-Security-Policy": CSP, "Cache-Control": "no-cache"}

    async def status_page(request: Request) -> Response:
        """The status page.
        ---
        responses:
          200: {description: the page}
        """
        return Response(page, media_type="text/html; charset=utf-8", headers=headers)

    async def static(request: Request) -> Response:
        """The page's stylesheet and script.
        ---
        parameters:
          - {name: name, in: path, required: true, schema: {type: string}}
        responses:
          200: {description: the file}
          404: {description: no such static file}
        """
        name = request.path_params["name"]
        if name not in assets:
            return Response("no such static file\n", status_code=404, media_type="text/plain")
        return Response(assets[name], media_type=STATIC[name], headers=headers)

    # A plain function: it runs on a thread pool (smlens.routing), so a full window never blocks /metrics.
    def history_json(request: Request) -> Response:
        """The timelines of every GPU over the window, the points after ``after`` only if it is given.
        ---
        parameters:
          - name: after
            in: query
            required: false
            description: sequence of the newest point the caller holds
            schema: {type: integer, minimum: 0}
        responses:
          200: {description: the points}
          422: {description: after is not a sequence number}
          503: {description: no complete sample yet}
        """
        try:
            after = _sequence(request.query_params.get("after"))
        except ValueError:
            return JSONResponse({"error": "after must be a sequence number (digits only)"}, status_code=422)
        publish()
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

    return Router(
        routes=[
            Route("/", status_page, methods=["GET"]),
            Route("/static/{name}", static, methods=["GET"]),
            Route("/api/v1/history", history_json, methods=["GET"]),
        ]
    )
