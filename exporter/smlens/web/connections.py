"""Connections with deadlines and a cap.

Each connection is in one of three states, each with its own deadline, after which it is aborted:
waiting for its first request (``header_timeout``: the request line and headers must be complete),
answering a request (``response_timeout``: a client that never reads cannot hold it), and idle
between requests (``idle_timeout``). The table of open connections has a cap, and each client
address a share of it (``per_address``). A new connection is always admitted: over its address's
share it replaces that address's own least useful connection; over the cap it replaces the least
useful connection of the address holding the most. Least useful: waiting for a request and never
served, then waiting, then the oldest busy one. So one address cannot fill the table, a fresh client
never waits behind silent or busy ones, and memory stays bounded whatever clients do. When the process
runs out of file descriptors before the cap, each failed accept sheds the least useful waiting connection
(:meth:`ConnectionTable.shed`), so that the next accept gets in.

The HTTP/1.1 protocol is uvicorn's with smlens' deadlines (:mod:`smlens.web.protocol`); TLS is started per
connection (``loop.start_tls``) with the context in force at accept time, so a reloaded certificate
applies to the next handshake.
"""

from __future__ import annotations

import asyncio
import ipaddress
import ssl
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, cast

from smlens.web.stats import ServingStats


@dataclass(frozen=True)
class Limits:
    header_timeout: float = 10.0
    idle_timeout: float = 60.0
    response_timeout: float = 60.0
    max_connections: int = 64

    @property
    def per_address(self) -> int:
        """Connections one client address may hold: an eighth of the cap, at least 4."""
        return min(self.max_connections, max(4, self.max_connections // 8))


class Tracked(Protocol):
    requests: int

    @property
    def waiting(self) -> bool: ...

    def drop(self, reason: str) -> None: ...


class ConnectionTable:
    """The open connections, oldest first, with their client addresses."""

    def __init__(self, limits: Limits, stats: ServingStats) -> None:
        self.limits = limits
        self.stats = stats
        self._open: dict[Tracked, str] = {}

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, conn: object) -> bool:
        return conn in self._open

    def __iter__(self) -> Iterator[Tracked]:
        return iter(list(self._open))  # a copy: dropping a connection while iterating removes it

    def admit(self, conn: Tracked, address: str) -> None:
        """Adds a new connection, first dropping another to keep the address's share and the cap."""
        mine = [c for c, a in self._open.items() if a == address]
        if len(mine) >= self.limits.per_address:
            _least_useful(mine).drop("per_address")
        elif len(self._open) >= self.limits.max_connections:
            counts = Counter(self._open.values())
            waiting = [c for c in self._open if c.waiting]
            if waiting:
                _least_useful(waiting).drop("evicted")
            else:
                busiest = max(counts, key=counts.__getitem__)  # first of the largest, in age order
                _least_useful([c for c, a in self._open.items() if a == busiest]).drop("evicted")
        self._open[conn] = address
        self.stats.open_connections = len(self._open)

    def shed(self, reason: str) -> bool:
        """Drops the least useful connection that waits for a request, if there is one."""
        waiting = [c for c in self._open if c.waiting]
        if not waiting:
            return False
        _least_useful(waiting).drop(reason)
        return True

    def replace(self, old: Tracked, new: Tracked) -> None:
        if old in self._open:
            self._open[new] = self._open.pop(old)

    def remove(self, conn: Tracked) -> None:
        self._open.pop(conn, None)
        self.stats.open_connections = len(self._open)


def _least_useful(conns: list[Tracked]) -> Tracked:
    """Never served and waiting, then waiting, then the oldest (``conns`` is oldest first)."""
    waiting = [c for c in conns if c.waiting]
    return next((c for c in waiting if c.requests == 0), None) or next(iter(waiting), conns[0])


def peer_address(transport: asyncio.BaseTransport) -> str:
    peer = transport.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else "?"


class Deadline:
    def __init__(self, loop: asyncio.AbstractEventLoop, on_expiry: Callable[[str], None]) -> None:
        self._loop = loop
        self._on_expiry = on_expiry
        self._handle: asyncio.TimerHandle | None = None

    def arm(self, seconds: float, reason: str) -> None:
        self.cancel()
        self._handle = self._loop.call_later(seconds, self._on_expiry, reason)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


def peer_sans(tls_object: ssl.SSLObject | None) -> set[str]:
    """The client certificate's DNS, IP, e-mail and URI names, IPs written as Go writes them."""
    cert: dict[str, Any] = dict(tls_object.getpeercert() or {}) if tls_object is not None else {}
    names: set[str] = set()
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "IP Address":
            names.add(str(ipaddress.ip_address(value.strip())))
        elif kind in ("DNS", "email", "URI"):
            names.add(value)
    return names


class _Holding(asyncio.Protocol):
    """Keeps what arrives between the end of a TLS handshake and the hand-over to HTTP."""

    def __init__(self) -> None:
        self.data: list[bytes] = []
        self.lost: tuple[Exception | None] | None = None

    def data_received(self, data: bytes) -> None:
        self.data.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = (exc,)

    def hand_over(self, protocol: asyncio.Protocol) -> None:
        for chunk in self.data:
            protocol.data_received(chunk)
        if self.lost is not None:
            protocol.connection_lost(self.lost[0])


class TlsGate(asyncio.Protocol):
    """Holds an accepted TCP connection through its TLS handshake (bounded by ``header_timeout``),
    then hands the encrypted transport to a new HTTP protocol, ``http(tcp_transport)``."""

    requests = 0
    waiting = True

    def __init__(
        self,
        table: ConnectionTable,
        context: ssl.SSLContext,
        allowed_sans: frozenset[str] | None,
        http: Callable[[asyncio.Transport], asyncio.Protocol],
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._table = table
        self._context = context
        self._allowed_sans = allowed_sans
        self._http = http
        self._loop = loop
        self._transport: asyncio.Transport | None = None
        self._task: asyncio.Task[None] | None = None
        self._dropped = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._table.admit(self, peer_address(transport))
        self._task = self._loop.create_task(self._handshake(transport))

    def connection_lost(self, exc: Exception | None) -> None:
        self._table.remove(self)

    async def _handshake(self, transport: asyncio.Transport) -> None:
        holding = _Holding()
        try:
            tls = await self._loop.start_tls(
                transport,
                holding,
                self._context,
                server_side=True,
                ssl_handshake_timeout=self._table.limits.header_timeout,
            )
        except (OSError, asyncio.TimeoutError):
            if not self._dropped:
                self.drop("tls_handshake")
            return
        if tls is None or transport.is_closing():
            self._table.remove(self)
            return
        if (
            self._allowed_sans is not None
            and not peer_sans(tls.get_extra_info("ssl_object")) & self._allowed_sans
        ):
            self._table.remove(self)
            self._table.stats.closed["client_sans"] += 1
            tls.abort()
            return
        http = self._http(transport)
        self._table.replace(self, cast(Tracked, http))
        tls.set_protocol(http)
        http.connection_made(tls)
        holding.hand_over(http)

    def drop(self, reason: str) -> None:
        self._dropped = True
        self._table.remove(self)
        self._table.stats.closed[reason] += 1
        if self._transport is not None:
            self._transport.abort()
