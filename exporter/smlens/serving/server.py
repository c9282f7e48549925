"""The HTTP server: binds before anything starts, serves the application behind the web configuration,
reloads that configuration on SIGHUP or when one of its files changes, and stops within a deadline on
SIGTERM whatever clients do.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from smlens.asgi import ASGIApp
from smlens.errors import SmlensError
from smlens.serving.connections import ConnectionTable, HttpConnection, Limits, TlsGate, peer_address
from smlens.serving.guard import Guard
from smlens.serving.stats import ServingStats
from smlens.serving.webconfig import PLAIN, WebConfig, load_web_config

log = logging.getLogger(__name__)

BACKLOG = 128
SHUTDOWN_GRACE = 2.0  # seconds open connections get to finish after SIGTERM before they are aborted
ACCEPT_ERROR_LOG_INTERVAL = 60.0
WATCH_INTERVAL = 1.0  # at most one check of the web config's files per this many seconds


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, or one sentence on why there cannot be one."""
    where = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            # a str host is encoded with the idna codec, which stays resident (0.19 MiB, docs/performance.md)
            host.encode() if host.isascii() else host,
            port,
            type=socket.SOCK_STREAM,
            flags=socket.AI_PASSIVE,
        )[0]
    except socket.gaierror as exc:
        raise SmlensError(f"cannot listen on {where}: the host does not resolve ({exc.strerror}).") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        raise SmlensError(f"cannot listen on {where}: {exc.strerror or exc}.") from None
    sock.setblocking(False)
    return sock


def _signature(paths: tuple[Path, ...]) -> tuple[tuple[int, int, int], ...]:
    stamps = []
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            stamps.append((0, 0, 0))
        else:
            stamps.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(stamps)


class WebServer:
    """Serves an application on ``sock`` until SIGTERM or SIGINT."""

    def __init__(
        self,
        sock: socket.socket,
        limits: Limits,
        web_config: WebConfig = PLAIN,
        protect_probes: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sock = sock
        self.limits = limits
        self.stats = ServingStats()
        self.web_config = web_config
        self._protect_probes = protect_probes
        self._clock = clock
        self._signature = _signature(web_config.watched)
        self._checked_at = clock()
        self._table = ConnectionTable(limits, self.stats)
        self._tasks: set[asyncio.Task[None]] = set()  # the requests being answered
        self._app: ASGIApp | None = None
        self._accept_errors_logged_at: float | None = None
        self._accept_errors_unlogged = 0
        self._stop: asyncio.Event | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.web_config.tls is not None else "http"

    def reload(self, why: str) -> None:
        """Reads the web config file again; a bad file is refused with one line and the old one stays."""
        path = self.web_config.path
        if path is None:
            return
        self._signature = _signature(self.web_config.watched)
        try:
            fresh = load_web_config(path)
        except SmlensError as exc:
            self.stats.reloads["failure"] += 1
            log.error("web config not reloaded (%s), the previous one stays in force: %s", why, exc)
            return
        if (fresh.tls is None) != (self.web_config.tls is None):
            self.stats.reloads["failure"] += 1
            log.error("web config not reloaded (%s): turning TLS on or off needs a restart.", why)
            return
        self.web_config = fresh
        self._signature = _signature(fresh.watched)
        self.stats.reloads["success"] += 1
        log.info("web config reloaded (%s)", why)

    def _watch(self) -> None:
        now = self._clock()
        if now - self._checked_at < WATCH_INTERVAL:
            return
        self._checked_at = now
        if _signature(self.web_config.watched) != self._signature:
            self.reload("a file changed")

    def _connection(self) -> Any:
        self._watch()
        loop = asyncio.get_running_loop()
        config = self.web_config
        app = self._app
        assert app is not None

        def http() -> HttpConnection:
            return HttpConnection(app, self._tasks, self._table, loop)

        if config.tls is None:
            return _AdmittedHttp(http(), self._table)
        return TlsGate(self._table, config.tls, config.allowed_sans, http, loop)

    def handle_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != "socket.accept() out of system resource":
            loop.default_exception_handler(context)
            return
        # asyncio pauses accepting for a second after such an error; log it at most once a minute.
        self.stats.accept_errors += 1
        self._accept_errors_unlogged += 1
        now = self._clock()
        last = self._accept_errors_logged_at
        if last is None or now - last >= ACCEPT_ERROR_LOG_INTERVAL:
            log.error(
                "cannot accept connections: %s (%d time(s) since the last report; next in %.0f s at most)",
                context.get("exception"),
                self._accept_errors_unlogged,
                ACCEPT_ERROR_LOG_INTERVAL,
            )
            self._accept_errors_logged_at = now
            self._accept_errors_unlogged = 0

    def stop(self) -> None:
        if self._stop is not None:
            self._stop.set()

    def run(self, app: ASGIApp) -> None:
        asyncio.run(self.serve(app))

    async def serve(self, app: ASGIApp, on_started: Callable[[], None] = lambda: None) -> None:
        self._app = Guard(app, lambda: self.web_config, self._protect_probes)
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self.handle_loop_error)
        self._stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._stop.set)
        loop.add_signal_handler(signal.SIGHUP, self.reload, "SIGHUP")
        server = await loop.create_server(self._connection, sock=self.sock, backlog=BACKLOG)
        on_started()
        try:
            await self._stop.wait()
        finally:
            server.close()
            await self._drain()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)

    async def _drain(self) -> None:
        """Closes idle connections, lets busy ones finish within SHUTDOWN_GRACE, then aborts the rest."""
        for conn in self._table:
            if isinstance(conn, HttpConnection):
                conn.shutdown()
            else:
                conn.drop("shutdown")
        deadline = self._clock() + SHUTDOWN_GRACE
        while len(self._table) and self._clock() < deadline:
            await asyncio.sleep(0.05)
        for conn in self._table:
            conn.drop("shutdown")
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            log.info("%d request(s) cancelled at shutdown", len(self._tasks))
            await asyncio.wait(list(self._tasks), timeout=0.5)


class _AdmittedHttp(asyncio.Protocol):
    """A plain-HTTP connection: admitted to the table at accept time, then HTTP from the first byte."""

    def __init__(self, http: HttpConnection, table: ConnectionTable) -> None:
        self._http = http
        self._table = table

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._table.admit(self._http, peer_address(transport))
        transport.set_protocol(self._http)
        self._http.connection_made(transport)
