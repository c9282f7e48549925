"""The HTTP server: uvicorn, given a socket bound before anything starts, serving the application behind the
web configuration; it reloads that configuration on SIGHUP or when one of its files changes, and stops
within a deadline on SIGTERM whatever clients do.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any, cast

import uvicorn
from starlette.types import ASGIApp
from uvicorn.server import ServerState

from smlens.errors import SmlensError
from smlens.settings import ServeSettings
from smlens.web.connections import ConnectionTable, Limits, TlsGate
from smlens.web.guard import Guard
from smlens.web.protocol import MAX_HEAD_BYTES, GuardedH11
from smlens.web.stats import ServingStats
from smlens.web.webconfig import PLAIN, WebConfig, load_web_config

log = logging.getLogger(__name__)

BACKLOG = 128
SHUTDOWN_GRACE = 2.0  # seconds open connections get to finish after SIGTERM before they are aborted
# Seconds after the connections are aborted that uvicorn waits for the requests' tasks before it cancels them.
CANCEL_AFTER = 0.5
ACCEPT_ERROR_LOG_INTERVAL = 60.0
WATCH_INTERVAL = 1.0  # at most one check of the web config's files per this many seconds


def bind(host: str, port: int) -> socket.socket:
    """A listening socket, or one sentence on why there cannot be one."""
    where = f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host,
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
        self._accept_errors_logged_at: float | None = None
        self._accept_errors_unlogged = 0
        self._server: _Server | None = None

    @property
    def scheme(self) -> str:
        return "https" if self.web_config.tls is not None else "http"

    @property
    def port(self) -> int:
        """The port bound (the one the system chose, for port 0)."""
        return int(self.sock.getsockname()[1])

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

    def _protocol(
        self,
        config: uvicorn.Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> asyncio.Protocol:
        """What uvicorn calls for each accepted connection, in place of its protocol class."""
        self._watch()
        web = self.web_config
        http = functools.partial(GuardedH11, config, server_state, app_state, _loop, table=self._table)
        if web.tls is None:
            return http()
        return TlsGate(
            self._table, web.tls, web.allowed_sans, lambda tcp: http(tcp=tcp), asyncio.get_running_loop()
        )

    def handle_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if context.get("message") != "socket.accept() out of system resource":
            loop.default_exception_handler(context)
            return
        # asyncio pauses accepting for a second after such an error (and reports it for each accept it had
        # left in that round); log it at most once a minute. Each report sheds one connection that waits
        # for a request, so that the retry finds descriptors free and a fresh client gets in: out of
        # descriptors, as over the cap, a new connection is admitted and a least useful one dropped.
        self._table.shed("evicted")
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
        if self._server is not None:
            self._server.should_exit = True

    def run(self, app: ASGIApp) -> None:
        asyncio.run(self.serve(app))

    async def serve(self, app: ASGIApp, on_started: Callable[[], None] = lambda: None) -> None:
        config = uvicorn.Config(
            Guard(app, lambda: self.web_config, self._protect_probes),
            # uvicorn only calls its protocol class, with these keywords: a factory can stand in for it.
            http=cast("type[asyncio.Protocol]", self._protocol),
            interface="asgi3",
            lifespan="off",
            ws="none",
            log_config=None,
            access_log=False,
            server_header=False,
            proxy_headers=False,  # the client address is the peer's: no X-Forwarded-For is believed
            backlog=BACKLOG,
            h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        )
        # Set here, not above: uvicorn's types say int, and both are seconds it uses as floats.
        config.timeout_keep_alive = self.limits.idle_timeout  # type: ignore[assignment]
        config.timeout_graceful_shutdown = SHUTDOWN_GRACE + CANCEL_AFTER  # type: ignore[assignment]
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(self.handle_loop_error)
        loop.add_signal_handler(signal.SIGHUP, self.reload, "SIGHUP")
        self._server = _Server(config, self._table, on_started)
        try:
            await self._server.serve(sockets=[self.sock])
        finally:
            loop.remove_signal_handler(signal.SIGHUP)


class _Server(uvicorn.Server):
    """uvicorn's server with SIGTERM and SIGINT taken on the event loop and not raised again when it
    stops (``smlens serve`` closes its data sources after the server returns), and every connection
    still open after the grace period aborted."""

    def __init__(
        self, config: uvicorn.Config, table: ConnectionTable, on_started: Callable[[], None]
    ) -> None:
        super().__init__(config)
        self._table = table
        self._on_started = on_started

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.handle_exit, sig, None)
        try:
            yield
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self._on_started()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for conn in self._table:
            if not isinstance(conn, GuardedH11):  # a TLS handshake: nothing to finish
                conn.drop("shutdown")
        # uvicorn waits its graceful timeout for the connections to close, then cancels the requests'
        # tasks. Aborting the connections still open at the grace period, before that, ends their
        # requests as disconnects (a response stuck on a client that never reads returns at once); the
        # cancellation stays for a request that does not end even so.
        abort = asyncio.get_running_loop().call_later(SHUTDOWN_GRACE, self._abort_open)
        try:
            await super().shutdown(sockets)
        finally:
            abort.cancel()
        self._abort_open()

    def _abort_open(self) -> None:
        for conn in self._table:
            conn.drop("shutdown")


def open_server(settings: ServeSettings) -> WebServer:
    """Reads the web config and binds the port, so that either refusal comes before anything starts."""
    web_config = load_web_config(settings.web_config_file) if settings.web_config_file else PLAIN
    limits = Limits(
        header_timeout=settings.web_header_timeout,
        idle_timeout=settings.web_idle_timeout,
        max_connections=settings.web_max_connections,
    )
    return WebServer(bind(*settings.listen), limits, web_config, protect_probes=settings.web_protect_probes)
