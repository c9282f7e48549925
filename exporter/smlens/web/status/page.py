"""The status page at ``/`` and the history it polls, ``/api/v1/history``.

The page is three files shipped with the package (static/, served by Starlette's static files): no CDN,
font or script from elsewhere, and a Content-Security-Policy that lets the browser load nothing but them
and this server's JSON. Every answer comes from the :class:`~smlens.web.status.history.History` ring;
none touches a backend.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

from smlens import __version__
from smlens.formatting import reason
from smlens.model import GpuState, Snapshot
from smlens.web.answers import READ, ErrorAnswer, HistoryAnswer
from smlens.web.status.history import MAX_VALUES_PER_ANSWER, SERIES, History, owners

# Same-origin only: the page must work on an air-gapped cluster and must not leak node data.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
# Other headers (X-Content-Type-Options, ...) come from the web config's http_server_config.headers.
PAGE_HEADERS = {"Content-Security-Policy": CSP, "Cache-Control": "no-cache"}
STATIC_DIR = Path(__file__).parent / "static"

Describe = Callable[[GpuState], dict[str, Any]]


class StaticAssets(StaticFiles):
    """The page's stylesheet and script, with the page's headers."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        response.headers.update(PAGE_HEADERS)
        return response


def _sequence(value: str | None) -> int | None:
    """``after`` as given: absent, or a sequence number (decimal digits); anything else is ValueError."""
    if value is None:
        return None
    if not (value.isascii() and value.isdigit()):
        raise ValueError(value)
    digits = value.lstrip("0")
    # int() refuses numbers over 4,300 digits; one that long is past every sequence, as a 20-digit one is.
    return int(digits or "0") if len(digits) <= 20 else sys.maxsize


def reasons(snapshot: Snapshot) -> dict[str, str]:
    """Each reason a GPU or MIG instance of the snapshot gives for an absent value, in words."""
    codes = {gpu.profiling_reason for gpu in snapshot.gpus} - {""}
    for gpu in snapshot.gpus:
        codes.update(gpu.missing.values())
        for instance in gpu.instances:
            codes.update(instance.missing.values())
    return {code: reason(code) for code in sorted(codes)}


def status_router(history: History, describe: Describe) -> APIRouter:
    """Routes of the page; ``describe`` is /api/v1/gpus' view of one GPU, so both agree on verdicts.
    The static files are mounted beside it (:class:`StaticAssets`)."""
    page = (STATIC_DIR / "index.html").read_bytes()
    router = APIRouter()

    @router.api_route("/", methods=READ, response_class=HTMLResponse)
    async def status_page() -> HTMLResponse:
        """The status page."""
        return HTMLResponse(page, headers=PAGE_HEADERS)

    # A plain function: Starlette runs it on its thread pool, so a full window never blocks /metrics.
    @router.api_route(
        "/api/v1/history",
        methods=READ,
        response_model=HistoryAnswer,
        responses={422: {"model": ErrorAnswer}, 503: {"model": ErrorAnswer}},
    )
    def history_json(response: Response, after: str | None = None) -> Any:
        """The timelines of every GPU over the window; with ``after`` (the sequence of the newest point the
        caller holds), only the points after it."""
        try:
            start = _sequence(after)
        except ValueError:
            return JSONResponse({"error": "after must be a sequence number (digits only)"}, status_code=422)
        window = history.window(start, MAX_VALUES_PER_ANSWER)
        if window is None:
            return JSONResponse({"error": "no complete sample yet"}, status_code=503)
        snap = window.snapshot
        response.headers["Cache-Control"] = "no-store"
        return {
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
            "reasons": reasons(snap),
        }

    return router
