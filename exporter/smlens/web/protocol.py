"""uvicorn's HTTP/1.1 protocol with smlens' connection policy on top.

uvicorn parses and frames (with h11) and runs the application; this subclass adds what an exporter on
every node of a cluster needs and plain uvicorn lacks: a place in the bounded connection table
(:class:`~smlens.web.connections.ConnectionTable`), a deadline for the first bytes to a complete request
head and one for the answer (a slowloris or a client that never reads cannot hold a connection), requests
that carry both Content-Length and Transfer-Encoding refused (RFC 9112 6.1: the shape of request
smuggling), heads over ``MAX_HEAD_BYTES`` refused, and malformed requests counted instead of logged.
"""

from __future__ import annotations

import asyncio
import http
import logging
from typing import Any

import h11
from uvicorn.config import Config
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.server import ServerState

from smlens.web.connections import ConnectionTable, Deadline, peer_address

# A request line and headers past this many bytes are refused (h11's default limit, and uvicorn's). h11
# checks it only while a head is incomplete; a complete one may arrive in one read of up to 256 KiB.
MAX_HEAD_BYTES = 16 * 1024

# uvicorn logs a warning for every request it cannot parse: a log flood for anyone who sends garbage.
# Those are counted in smlens_http_malformed_requests_total instead; errors of the application stay logged.
_LOG = logging.getLogger("smlens.web.protocol")
_LOG.setLevel(logging.ERROR)


def refusal(request: h11.Request) -> int | None:
    """The status for a request that h11 parsed but smlens refuses, if any."""
    size = len(request.method) + len(request.target) + sum(len(n) + len(v) + 4 for n, v in request.headers)
    if size > MAX_HEAD_BYTES:
        return 431
    names = {name for name, _ in request.headers}
    if {b"content-length", b"transfer-encoding"} <= names:
        return 400
    return None


class _RefusingConnection(h11.Connection):
    """h11's server side, raising on the requests :func:`refusal` names; ``status`` is what to answer."""

    status = 400

    def next_event(self) -> Any:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as error:
            self.status = error.error_status_hint
            raise
        if isinstance(event, h11.Request):
            status = refusal(event)
            if status is not None:
                self.status = status
                raise h11.RemoteProtocolError("refused request head", error_status_hint=status)
        return event


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""


class GuardedH11(H11Protocol):
    """One connection: uvicorn's protocol under the table's cap and smlens' deadlines. The idle deadline
    between requests is uvicorn's keep-alive timeout (``Config.timeout_keep_alive``)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
        *,
        table: ConnectionTable,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.conn = _RefusingConnection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.logger = _LOG
        self.requests = 0
        self._table = table
        self._deadline = Deadline(self.loop, self.drop)
        self._idle = False  # between a response and the first byte of the next request

    @property
    def waiting(self) -> bool:
        """No request is being answered."""
        return self.cycle is None or self.cycle.response_complete

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self not in self._table:  # a TLS connection was admitted at accept time, as its gate
            self._table.admit(self, peer_address(transport))
        self._deadline.arm(self._table.limits.header_timeout, "header_timeout")

    def data_received(self, data: bytes) -> None:
        if self._idle:  # a next request starts: its head gets header_timeout, not what the idle time left
            self._idle = False
            self._deadline.arm(self._table.limits.header_timeout, "header_timeout")
        super().data_received(data)

    def handle_events(self) -> None:
        cycle = self.cycle
        super().handle_events()
        if self.cycle is not cycle and not self.transport.is_closing():  # a request's head is complete
            self._idle = False
            self.requests += 1
            self._deadline.arm(self._table.limits.response_timeout, "response_timeout")

    def on_response_complete(self) -> None:
        self._deadline.cancel()
        self._idle = True
        super().on_response_complete()  # arms the keep-alive timeout, or starts a pipelined request

    def timeout_keep_alive_handler(self) -> None:
        self.drop("idle_timeout")

    def send_400_response(self, msg: str) -> None:
        """Answers a request that could not be parsed or is refused (400, or 431 for a head too large),
        and closes the connection."""
        self._table.stats.malformed_requests += 1
        self._deadline.cancel()
        if self.cycle is not None and not self.cycle.response_complete:
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        status = self.conn.status if isinstance(self.conn, _RefusingConnection) else 400
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            body = f"{status} {_phrase(status)}\n".encode()
            headers = [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
                *self.server_state.default_headers,
            ]
            for event in (
                h11.Response(status_code=status, headers=headers, reason=_phrase(status).encode()),
                h11.Data(data=body),
                h11.EndOfMessage(),
            ):
                self.transport.write(self.conn.send(event) or b"")
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadline.cancel()
        self._table.remove(self)
        super().connection_lost(exc)

    def drop(self, reason: str) -> None:
        self._deadline.cancel()
        self._table.remove(self)
        self._table.stats.closed[reason] += 1
        self._unset_keepalive_if_required()
        if self.transport is not None:
            self.transport.abort()
