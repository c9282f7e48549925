"""uvicorn's HTTP/1.1 protocol with smlens' connection policy on top.

uvicorn parses and frames (with h11) and runs the application; this subclass adds what an exporter on
every node of a cluster needs and plain uvicorn lacks: a place in the bounded connection table
(:class:`~smlens.web.connections.ConnectionTable`), a deadline for the first bytes to a complete request
head and one for the answer (a slowloris or a client that never reads cannot hold a connection), requests
that carry both Content-Length and Transfer-Encoding refused (RFC 9112 6.1: the shape of request
smuggling), heads over ``MAX_HEAD_BYTES`` refused, and malformed requests counted instead of logged; a
response that starts before its request's body has arrived ends the connection, nothing is read after a
request that ends it, and at shutdown an idle TLS connection does not wait for the client's close_notify.
The methods overridden here are the ones uvicorn's own H11Protocol calls for these events.
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


class _NotCancellations(logging.Filter):
    """uvicorn logs every request it cancels at the end of the shutdown grace period as an error with a
    traceback; it has already said in one line how many it cancelled."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], asyncio.CancelledError))


# uvicorn logs a warning for every request it cannot parse: a log flood for anyone who sends garbage.
# Those are counted in smlens_http_malformed_requests_total instead; errors of the application stay logged.
_LOG = logging.getLogger("smlens.web.protocol")
_LOG.setLevel(logging.ERROR)
_LOG.addFilter(_NotCancellations())


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
    """h11's server side, raising on the requests :func:`refusal` names; ``status`` is what to answer.
    A response that starts before its request's body has arrived (an endpoint that reads no body, a client
    still waiting for ``100 Continue``) ends the connection: otherwise uvicorn would read and discard the
    rest of a body of any announced size, and keep the connection for a next request."""

    status = 400

    def send(self, event: h11.Event) -> bytes | None:  # type: ignore[override]  # h11's overloads, merged
        if (
            isinstance(event, h11.Response)
            and self.their_state is h11.SEND_BODY
            and (b"connection", b"close") not in event.headers
        ):
            event = h11.Response(
                status_code=event.status_code,
                headers=[*event.headers, (b"connection", b"close")],
                reason=event.reason,
                http_version=event.http_version,
            )
        return super().send(event)

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
        tcp: asyncio.Transport | None = None,
    ) -> None:
        """``tcp``: under TLS, the connection's TCP transport (``transport`` is then the TLS one)."""
        super().__init__(config, server_state, app_state, _loop)
        # uvicorn reads its h11 connection from this attribute everywhere, cycles included.
        self.conn = _RefusingConnection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.logger = _LOG  # uvicorn's request cycles log through the protocol's logger
        self.requests = 0
        self._table = table
        self._tcp = tcp
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
        # After a request that ends the connection (Connection: close, HTTP/1.0) nothing more is read as
        # HTTP (RFC 9112 9.6): h11 would call it an error and uvicorn answer it with a 400.
        if self.conn.their_state is h11.MUST_CLOSE or self.transport.is_closing():
            self.flow.pause_reading()
            return
        if self._idle:  # a next request starts: its head gets header_timeout, not what the idle time left
            self._idle = False
            self._deadline.arm(self._table.limits.header_timeout, "header_timeout")
        super().data_received(data)

    def handle_events(self) -> None:
        # uvicorn's parse loop starts a new request cycle once a head is complete: a new one after it
        # means a request to answer, within response_timeout.
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
        if self._idle and self.conn.trailing_data[0] and not self.transport.is_closing():
            # Part of a next request's head came with the last one: it is a head in progress, with the
            # header timeout, not an idle connection.
            self._unset_keepalive_if_required()
            self._idle = False
            self._deadline.arm(self._table.limits.header_timeout, "header_timeout")

    def timeout_keep_alive_handler(self) -> None:
        """uvicorn's keep-alive timer (``idle_timeout`` here) fired: counted, and the connection aborted."""
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

    def shutdown(self) -> None:
        """The server stops: an idle connection is closed now, a busy one after its response."""
        idle = self.waiting
        try:
            super().shutdown()
        except h11.LocalProtocolError:  # h11 is in its error state: there is nothing left to close politely
            self.transport.close()
        if idle and self._tcp is not None:
            # Closing a TLS transport waits for the client's close_notify, which an idle keep-alive client
            # sends only when it next reads: ours is written, then the TCP connection is closed at once.
            self._tcp.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadline.cancel()
        self._table.remove(self)
        super().connection_lost(exc)

    def drop(self, reason: str) -> None:
        self._deadline.cancel()
        self._table.remove(self)
        self._table.stats.closed[reason] += 1
        self._unset_keepalive_if_required()  # uvicorn's timer would otherwise fire on a dropped connection
        if self.transport is not None:
            self.transport.abort()
