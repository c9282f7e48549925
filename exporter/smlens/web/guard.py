"""What exporter-toolkit's handler does in front of the application: basic auth against bcrypt hashes,
the configured response headers, the optional rate limit; plus HEAD answered for every GET route.

The web configuration is read through a callable, so a reload (SIGHUP or a changed file) takes effect
on the next request without rebuilding the application.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from smlens.web.webconfig import WebConfig, check_password

PROBES = frozenset({"/-/healthy", "/-/ready"})
CACHE_SIZE = 100  # successful (user, hash, password) checks remembered, as exporter-toolkit does
# bcrypt is deterministic, so a failed (user, hash, password) fails again: remembered, it costs no hash.
REFUSED_CACHE_SIZE = 1024
# Hashes one client address may ask for (wrong passwords that are not in the cache), then 401 at once.
CHECKS_PER_SECOND, CHECKS_BURST, ADDRESSES = 1.0, 5, 1024
# exporter-toolkit's hash for unknown users, so that an unknown name costs as much as a wrong password.
_DUMMY_HASH = b"$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"


def basic_credentials(header: bytes) -> tuple[bytes, bytes] | None:
    scheme, _, encoded = header.partition(b" ")
    if scheme.lower() != b"basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    return (user, password) if sep else None


class _TokenBucket:
    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        self.rate, self.capacity, self._clock = rate, float(max(burst, 1)), clock
        self._tokens, self._at = self.capacity, clock()

    def allow(self) -> bool:
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True


class Guard:
    """ASGI middleware around the smlens application."""

    def __init__(
        self,
        app: ASGIApp,
        config: Callable[[], WebConfig],
        protect_probes: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._app = app
        self._config = config
        self._protect_probes = protect_probes
        self._clock = clock
        self._verified: OrderedDict[bytes, None] = OrderedDict()
        self._refused: OrderedDict[bytes, None] = OrderedDict()
        self._checks: OrderedDict[str, _TokenBucket] = OrderedDict()
        self._bcrypt = asyncio.Lock()  # one bcrypt hash at a time, as exporter-toolkit does
        self._bucket: tuple[WebConfig, _TokenBucket] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        config = self._config()
        extra = list(config.headers)
        # The probes stay open to the kubelet (limit and auth) unless --web-protect-probes.
        guarded = self._protect_probes or scope["path"] not in PROBES
        if guarded and not self._allow(config):
            await _plain(send, 429, b"Too Many Requests\n", extra)
            return
        needs_auth = config.users and guarded
        client = scope.get("client")
        if needs_auth and not await self._authorized(
            config, dict(scope["headers"]).get(b"authorization", b""), client[0] if client else ""
        ):
            await _plain(send, 401, b"Unauthorized\n", [*extra, (b"www-authenticate", b"Basic")])
            return
        if scope["method"] == "HEAD":  # the HTTP layer drops the body of a HEAD response
            scope = dict(scope, method="GET")

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start" and extra:
                message = dict(message, headers=[*message.get("headers", []), *extra])
            await send(message)

        await self._app(scope, receive, send_with_headers)

    def _allow(self, config: WebConfig) -> bool:
        if config.rate_per_second <= 0:
            return True
        if self._bucket is None or self._bucket[0] is not config:
            self._bucket = (config, _TokenBucket(config.rate_per_second, config.burst, self._clock))
        return self._bucket[1].allow()

    async def _authorized(self, config: WebConfig, header: bytes, address: str) -> bool:
        credentials = basic_credentials(header)
        if credentials is None:
            return False
        user, password = credentials
        try:
            known = config.users.get(user.decode())
        except UnicodeDecodeError:  # no configured name: it would match U+FFFD after a lenient decode
            known = None
        hashed = known or _DUMMY_HASH
        parts = (user, hashed, password)
        key = hashlib.sha256(b"".join(len(p).to_bytes(4, "big") + p for p in parts)).digest()
        if key in self._verified:
            return True
        if key in self._refused or not self._may_hash(address):
            return False
        async with self._bcrypt:
            ok = await asyncio.to_thread(check_password, hashed, password)
        ok = ok and known is not None
        _remember(self._verified if ok else self._refused, key, CACHE_SIZE if ok else REFUSED_CACHE_SIZE)
        return ok

    def _may_hash(self, address: str) -> bool:
        bucket = self._checks.pop(address, None) or _TokenBucket(CHECKS_PER_SECOND, CHECKS_BURST, self._clock)
        self._checks[address] = bucket  # most recent last
        if len(self._checks) > ADDRESSES:
            self._checks.popitem(last=False)
        return bucket.allow()


def _remember(cache: OrderedDict[bytes, None], key: bytes, size: int) -> None:
    cache[key] = None
    if len(cache) > size:
        cache.popitem(last=False)


async def _plain(send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]]) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
