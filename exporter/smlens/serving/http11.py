"""HTTP/1.1 over one connection: h11 parses and frames, each request runs the ASGI 3 application in a task.

Requests on a connection are answered one after another: a pipelined request waits, with reading
paused, until the response before it is complete. A request body beyond ``BODY_HIGH_WATER`` bytes not
yet taken by the application pauses reading too, and a full write buffer makes the application's next
``send`` wait. Subclasses hook in at the points of a connection's life (``request_started``,
``response_complete``, ``malformed``) without touching the protocol.
"""

from __future__ import annotations

import asyncio
import functools
import http
import logging
import time
from urllib.parse import unquote

import h11

from smlens.asgi import ASGIApp, Message, Scope

log = logging.getLogger(__name__)

BODY_HIGH_WATER = 64 * 1024
# A request line and headers past this many bytes get a 431 (h11's default, and uvicorn's). h11 checks it only
# while a head is incomplete; _refusal checks a complete one, which may arrive in one read of up to 256 KiB.
MAX_HEAD_BYTES = 16 * 1024
_PLAIN = (b"content-type", b"text/plain; charset=utf-8")
_CLOSE = (b"connection", b"close")


def _reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""


_DAYS = (b"Mon", b"Tue", b"Wed", b"Thu", b"Fri", b"Sat", b"Sun")
_MONTHS = (b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov", b"Dec")


@functools.lru_cache(maxsize=1)
def _http_date(second: int) -> tuple[bytes, bytes]:
    """The Date header (RFC 9110 6.6.1: every response of a server with a clock), made once a second, in
    IMF-fixdate. Written out: email.utils.formatdate would import ten modules (0.16 MiB) for it."""
    t = time.gmtime(second)
    day = b"%s, %02d %s %04d" % (_DAYS[t.tm_wday], t.tm_mday, _MONTHS[t.tm_mon - 1], t.tm_year)
    return (b"date", b"%s %02d:%02d:%02d GMT" % (day, t.tm_hour, t.tm_min, t.tm_sec))


def _refusal(request: h11.Request) -> int | None:
    """The status for a request h11 parsed but smlens refuses, if any."""
    size = len(request.method) + len(request.target) + sum(len(n) + len(v) + 4 for n, v in request.headers)
    if size > MAX_HEAD_BYTES:
        return 431
    names = {name for name, _ in request.headers}
    if {b"content-length", b"transfer-encoding"} <= names:  # RFC 9112 6.1: smuggling through a proxy
        return 400
    return None


def _address(value: object) -> tuple[str, int] | None:
    return (str(value[0]), int(value[1])) if isinstance(value, tuple) and len(value) >= 2 else None


class Exchange:
    """One request and its response: the ASGI ``receive`` and ``send`` of one application call."""

    def __init__(self, connection: Http11, scope: Scope, head_only: bool) -> None:
        self._connection = connection
        self.scope = scope
        self._head_only = head_only
        self.body = bytearray()
        self.more_body = True
        self.arrived = asyncio.Event()  # body data, its end, the response's end or the connection's
        self.started = False
        self.complete = False
        self.disconnected = False
        self.keep_alive = True

    def abandon(self) -> None:
        self.disconnected = True
        self.arrived.set()

    async def receive(self) -> Message:
        if not (self.disconnected or self.complete):
            connection = self._connection
            if connection.h11.they_are_waiting_for_100_continue:
                connection.write(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue"))
            if connection.h11.their_state is h11.SEND_BODY:  # else nothing more of this request is to come
                connection.resume_reading()
            await self.arrived.wait()
            self.arrived.clear()
        if self.disconnected or self.complete:
            return {"type": "http.disconnect"}
        message = {"type": "http.request", "body": bytes(self.body), "more_body": self.more_body}
        self.body.clear()
        return message

    async def send(self, message: Message) -> None:
        connection = self._connection
        await connection.writable.wait()
        if self.disconnected:
            return
        kind = message["type"]
        if not self.started and kind == "http.response.start":
            headers = list(message.get("headers", ()))
            # Answered before its body arrived (or was asked for, with 100-continue): the rest of the body
            # cannot be told from a next request without reading it all, so the connection ends here.
            if not self.keep_alive or connection.h11.their_state is h11.SEND_BODY:
                headers.append(_CLOSE)
            if not any(name.lower() == b"date" for name, _ in headers):
                headers.append(_http_date(int(time.time())))
            status = int(message["status"])
            connection.write(h11.Response(status_code=status, headers=headers, reason=_reason(status)))
            self.started = True
        elif self.started and not self.complete and kind == "http.response.body":
            body = message.get("body", b"")
            if body and not self._head_only:
                connection.write(h11.Data(data=body))
            if not message.get("more_body", False):
                connection.write(h11.EndOfMessage())
                self.complete = True
                self.arrived.set()
                connection.finished(self)
        else:
            raise RuntimeError(f"unexpected ASGI message {kind!r} (response started: {self.started})")


class Http11(asyncio.Protocol):
    """Serves ``app`` on one connection; every request's task is added to ``tasks`` while it runs."""

    def __init__(self, app: ASGIApp, tasks: set[asyncio.Task[None]], loop: asyncio.AbstractEventLoop) -> None:
        self._app = app
        self._tasks = tasks
        self._loop = loop
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.writable = asyncio.Event()
        self.writable.set()
        self._reading_paused = False
        self._base_scope: Scope = {}

    # Hooks for subclasses.
    def request_started(self) -> None:
        """A request line and its headers are complete."""

    def response_complete(self) -> None:
        """The last byte of a response is written and the connection stays open."""

    def malformed(self) -> None:
        """The client sent something that is not HTTP/1.1; it is answered and the connection closed."""

    @property
    def waiting(self) -> bool:
        """No request is being answered."""
        return self.exchange is None or self.exchange.complete

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self._base_scope = {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "scheme": "https" if transport.get_extra_info("ssl_object") is not None else "http",
            "server": _address(transport.get_extra_info("sockname")),
            "client": _address(transport.get_extra_info("peername")),
            "root_path": "",
        }

    def data_received(self, data: bytes) -> None:
        assert self.transport is not None
        # After a request that ends the connection, nothing more is read as HTTP (RFC 9112 9.6).
        if self.transport.is_closing() or self.h11.their_state is h11.MUST_CLOSE:
            return
        self.h11.receive_data(data)
        self._process()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.exchange is not None and not self.exchange.complete:
            self.exchange.abandon()
        self.writable.set()  # a send waiting for room finds the exchange abandoned

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def pause_reading(self) -> None:
        if not self._reading_paused and self.transport is not None:
            self._reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self._reading_paused and self.transport is not None:
            self._reading_paused = False
            self.transport.resume_reading()

    def write(self, event: h11.Event) -> None:
        assert self.transport is not None
        data = self.h11.send(event)
        if data:
            self.transport.write(data)

    def shutdown(self) -> None:
        """Closes the connection now if it is idle, else after the response in progress."""
        assert self.transport is not None
        if self.waiting:
            self.transport.close()
        else:
            assert self.exchange is not None
            self.exchange.keep_alive = False

    def _process(self) -> None:
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as error:
                self._refuse(error.error_status_hint)
                return
            if event is h11.NEED_DATA:
                return
            if event is h11.PAUSED:  # a pipelined request: it waits for the response before it
                self.pause_reading()
                return
            exchange = self.exchange
            if isinstance(event, h11.Request):
                status = _refusal(event)
                if status is not None:
                    self._refuse(status)
                    return
                self._start(event)
            elif isinstance(event, h11.Data) and exchange is not None:
                exchange.body += event.data
                if len(exchange.body) > BODY_HIGH_WATER:
                    self.pause_reading()
                exchange.arrived.set()
            elif isinstance(event, h11.EndOfMessage) and exchange is not None:
                exchange.more_body = False
                exchange.arrived.set()
                if self.h11.their_state is h11.MUST_CLOSE:  # no next request: nothing more to read
                    self.pause_reading()
                    return
            elif isinstance(event, h11.ConnectionClosed):
                return

    def _start(self, request: h11.Request) -> None:
        raw_path, _, query = request.target.partition(b"?")
        method = request.method.decode("ascii")
        scope: Scope = {
            **self._base_scope,
            "http_version": request.http_version.decode("ascii"),
            "method": method,
            "path": unquote(raw_path.decode("ascii")),
            "raw_path": raw_path,
            "query_string": query,
            "headers": list(request.headers),  # h11 gives the names in lower case
        }
        self.exchange = Exchange(self, scope, head_only=method == "HEAD")
        self.request_started()
        task = self._loop.create_task(self._run(self.exchange))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, exchange: Exchange) -> None:
        assert self.transport is not None
        try:
            await self._app(exchange.scope, exchange.receive, exchange.send)
        except Exception:
            scope = exchange.scope
            log.exception("error answering %s %r", scope["method"], scope["path"])
            if not exchange.started and self.h11.our_state is h11.SEND_RESPONSE:
                await self._error_500(exchange)
            else:
                self.transport.close()
            return
        if exchange.disconnected or exchange.complete:
            return
        log.error("the application returned without completing the response to %r", exchange.scope["path"])
        if exchange.started:
            self.transport.close()
        else:
            await self._error_500(exchange)

    async def _error_500(self, exchange: Exchange) -> None:
        exchange.keep_alive = False
        body = b"Internal Server Error\n"
        headers = [_PLAIN, (b"content-length", str(len(body)).encode())]
        await exchange.send({"type": "http.response.start", "status": 500, "headers": headers})
        await exchange.send({"type": "http.response.body", "body": body})

    def finished(self, exchange: Exchange) -> None:
        assert self.transport is not None
        if self.transport.is_closing():
            return
        if self.h11.our_state is h11.MUST_CLOSE or not exchange.keep_alive:
            self.transport.close()
            return
        self.response_complete()
        self._next_cycle()

    def _next_cycle(self) -> None:
        self.h11.start_next_cycle()
        self.resume_reading()
        self._process()

    def _refuse(self, status: int) -> None:
        """Answers a request h11 could not parse (400, or 431 for an oversized head) and closes."""
        assert self.transport is not None
        self.malformed()
        if self.exchange is not None and not self.exchange.complete:
            self.exchange.abandon()
        if self.h11.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            body = f"{status} {_reason(status).decode()}\n".encode()
            length = (b"content-length", str(len(body)).encode())
            headers = [_PLAIN, length, _CLOSE, _http_date(int(time.time()))]
            self.write(h11.Response(status_code=status, headers=headers, reason=_reason(status)))
            self.write(h11.Data(data=body))
            self.write(h11.EndOfMessage())
        self.transport.close()
