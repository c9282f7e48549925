"""Opt-in admin endpoints, behind a bearer token: pause DCGM profiling so that Nsight Compute (or any
tool that needs the GPUs' performance counters) can run on the node, and resume it afterwards.

While paused, SM-level metrics are absent (``gpu_profiling_available`` 0), never zero. The pause is
hostengine-wide: it also pauses every other DCGM client on the node, e.g. dcgm-exporter.
"""

from __future__ import annotations

import secrets
from typing import Protocol

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from smlens.errors import BackendError, ConfigError

MIN_TOKEN_LENGTH = 16


class ProfilingControl(Protocol):
    """What the router drives; :class:`smlens.backends.dcgm.DcgmBackend` is one."""

    @property
    def paused(self) -> bool: ...

    def pause_profiling(self) -> None: ...

    def resume_profiling(self) -> None: ...


def profiling_router(control: ProfilingControl, token: str) -> APIRouter:
    """``GET /admin/profiling`` (state), ``POST /admin/profiling/pause`` and ``.../resume``;
    every call needs ``Authorization: Bearer <token>``."""
    if len(token.strip()) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"the admin token must be at least {MIN_TOKEN_LENGTH} characters long.")
    expected = token.strip().encode()

    def authorized(request: Request) -> bool:
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and secrets.compare_digest(given.strip().encode(), expected)

    router = APIRouter(prefix="/admin/profiling")

    def deny() -> JSONResponse:
        return JSONResponse(
            {"error": "this endpoint needs a valid 'Authorization: Bearer <token>' header"},
            status_code=401,
            headers={"WWW-Authenticate": "Bearer"},
        )

    def state() -> JSONResponse:
        return JSONResponse({"paused": control.paused})

    def act(pause: bool) -> JSONResponse:
        try:
            if pause:
                control.pause_profiling()
            else:
                control.resume_profiling()
        except BackendError as exc:
            status = 409 if exc.reason == "not_supported" else 503
            return JSONResponse({"error": str(exc), "reason": exc.reason}, status_code=status)
        return state()

    @router.get("")
    def get_state(request: Request) -> JSONResponse:
        return state() if authorized(request) else deny()

    @router.post("/pause")
    def pause(request: Request) -> JSONResponse:
        return act(pause=True) if authorized(request) else deny()

    @router.post("/resume")
    def resume(request: Request) -> JSONResponse:
        return act(pause=False) if authorized(request) else deny()

    return router
