"""Opt-in admin endpoints, behind a bearer token: pause DCGM profiling so that Nsight Compute (or any
tool that needs the GPUs' performance counters) can run on the node, and resume it afterwards.

While paused, SM-level metrics are absent (``gpu_profiling_available`` 0), never zero. The pause is
hostengine-wide: it also pauses every other DCGM client on the node, e.g. dcgm-exporter.
"""

from __future__ import annotations

import logging
import secrets
import stat
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import JSONResponse

from smlens.errors import BackendError, ConfigError
from smlens.files import read_bounded
from smlens.sources.base import ProfilingControl
from smlens.web.answers import READ, ErrorAnswer, ProfilingRefusal, ProfilingState

MIN_TOKEN_LENGTH = 16

log = logging.getLogger(__name__)


def checked_token(token: str, origin: str = "the admin token") -> str:
    """The token without surrounding blanks, if it is strong enough; else one sentence."""
    token = token.strip()
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(f"{origin} must be at least {MIN_TOKEN_LENGTH} characters long.")
    if not (token.isascii() and token.isprintable()):
        # An HTTP header carries bytes, not text: no two clients agree on how to send other characters.
        raise ConfigError(f"{origin} must be printable ASCII characters only.")
    return token


def read_token(path: Path) -> str:
    """The token in ``path``: exactly one line (a final newline allowed) of 16+ characters. A file
    that others than its owner can read draws a warning: anyone who reads it can pause profiling."""
    data = read_bounded(path, "admin token file", limit=4096)
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"cannot read admin token file {path}: {exc.strerror}.") from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"admin token file {path} is not UTF-8 text.") from None
    line = text.removesuffix("\n").removesuffix("\r")
    if "\n" in line or "\r" in line:
        raise ConfigError(f"admin token file {path} must hold exactly one line, the token.")
    token = checked_token(line, f"the token in admin token file {path}")
    if mode & (stat.S_IRGRP | stat.S_IROTH):
        log.warning(
            "admin token file %s is readable by its group or by everyone (mode %03o); chmod 600 it",
            path,
            stat.S_IMODE(mode),
        )
    return token


class _TokenRefused(Exception):
    """No valid admin token: answered 401 by the handler :func:`add_profiling_admin` installs."""


def _refused(request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(
        {"error": "this endpoint needs a valid 'Authorization: Bearer <token>' or X-Admin-Token header"},
        status_code=401,
        headers={"WWW-Authenticate": "Bearer"},
    )


def add_profiling_admin(app: FastAPI, control: ProfilingControl, token: str) -> None:
    """``GET /admin/profiling`` (state), ``POST /admin/profiling/pause`` and ``.../resume``; every call
    needs ``Authorization: Bearer <token>`` or, behind basic auth, ``X-Admin-Token: <token>``."""
    expected = checked_token(token).encode()

    def authorized(request: Request) -> None:
        # Behind basic auth (a web config file), Authorization carries the basic credentials: the token
        # then comes in X-Admin-Token.
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer":
            given = request.headers.get("x-admin-token", "")
        if not (given and secrets.compare_digest(given.strip().encode("latin-1"), expected)):
            raise _TokenRefused

    router = APIRouter(
        prefix="/admin/profiling",
        dependencies=[Depends(authorized)],
        responses={401: {"model": ErrorAnswer, "description": "no valid token"}},
    )

    def act(pause: bool) -> JSONResponse | dict[str, bool]:
        try:
            if pause:
                control.pause_profiling()
            else:
                control.resume_profiling()
        except BackendError as exc:
            status = 409 if exc.reason == "not_supported" else 503
            return JSONResponse({"error": str(exc), "reason": exc.reason}, status_code=status)
        return {"paused": control.paused}

    # Plain functions: Starlette runs them on its thread pool, so a slow hostengine never blocks /metrics.
    @router.api_route("", methods=READ, response_model=ProfilingState)
    def state() -> dict[str, bool]:
        """Is DCGM profiling paused?"""
        return {"paused": control.paused}

    switched: dict[int | str, dict[str, Any]] = {
        409: {"model": ProfilingRefusal, "description": "this node cannot pause profiling"},
        503: {"model": ProfilingRefusal, "description": "the hostengine did not answer"},
    }

    @router.post("/pause", response_model=ProfilingState, responses=switched)
    def pause() -> JSONResponse | dict[str, bool]:
        """Pause DCGM profiling on this node, hostengine-wide."""
        return act(pause=True)

    @router.post("/resume", response_model=ProfilingState, responses=switched)
    def resume() -> JSONResponse | dict[str, bool]:
        """Resume DCGM profiling on this node."""
        return act(pause=False)

    app.include_router(router)
    app.add_exception_handler(_TokenRefused, _refused)
