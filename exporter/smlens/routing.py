"""smlens' routes as one ASGI application: path templates, methods (HEAD with every GET), the 405 with its
``Allow``, the 404, and the redirect of a path that matches a route once a trailing slash is added or
removed; each answer as the Starlette routes this replaced gave it (tests/test_http_routes.py pins them),
except that the redirect names only the path: the Host header is never written back to a client.

A plain (not async) handler runs on a thread pool of its own, so that a slow one never holds up the event
loop that serves /metrics, nor waits behind the guard's password checks on asyncio's default pool.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from functools import cached_property
from typing import Any, TypeVar
from urllib.parse import parse_qsl, quote, quote_from_bytes

from smlens.asgi import Receive, Scope, Send

_PARAMETER = re.compile(r"{([A-Za-z_][A-Za-z0-9_]*)}")
T = TypeVar("T")
HANDLER_THREADS = 4  # plain handlers are quick reads of state (admin, history); a few suffice


class Request:
    """What a handler reads of its request."""

    def __init__(self, scope: Scope, path_params: dict[str, str]) -> None:
        self._scope = scope
        self.path_params = path_params

    @cached_property
    def headers(self) -> dict[str, str]:
        """By lower-case name; of a repeated header, the first."""
        return {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in reversed(self._scope["headers"])
        }

    @cached_property
    def query_params(self) -> dict[str, str]:
        """Decoded, blank values kept; of a repeated parameter, the last."""
        return dict(parse_qsl(self._scope["query_string"].decode("latin-1"), keep_blank_values=True))


class Response:
    """A complete answer: the given headers, then Content-Length and Content-Type (text gets utf-8)."""

    media_type: str | None = None

    def __init__(
        self,
        content: Any = b"",
        status_code: int = 200,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
    ) -> None:
        self.status_code = status_code
        self.body = self.render(content)
        kind = media_type or self.media_type
        self.headers = [
            (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()
        ]
        given = {name for name, _ in self.headers}
        if b"content-length" not in given:
            self.headers.append((b"content-length", str(len(self.body)).encode()))
        if kind is not None and b"content-type" not in given:
            if kind.startswith("text/") and "charset=" not in kind.lower():
                kind += "; charset=utf-8"
            self.headers.append((b"content-type", kind.encode("latin-1")))

    def render(self, content: Any) -> bytes:
        return content.encode() if isinstance(content, str) else bytes(content)

    async def __call__(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.headers})
        await send({"type": "http.response.body", "body": self.body})


class PlainTextResponse(Response):
    media_type = "text/plain"


class JSONResponse(Response):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        # NaN and infinities are not JSON: refused (a 500), never sent. Text that is not valid (a lone
        # surrogate from a file name that is not UTF-8) gets "?" for its bad bytes, as on /metrics.
        text = json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
        return text.encode(errors="replace")


Handler = Callable[[Request], "Response | Awaitable[Response]"]


class Route:
    """``path`` may hold ``{name}`` parts, each one path segment, given to the handler as a path parameter."""

    def __init__(self, path: str, endpoint: Handler, methods: Iterable[str] = ("GET",)) -> None:
        self.path = path
        self.endpoint = endpoint
        named = tuple(dict.fromkeys(method.upper() for method in methods))
        self.methods = (*named, "HEAD") if "GET" in named and "HEAD" not in named else named
        parts = _PARAMETER.split(path)  # literal, name, literal, ...
        pattern = "".join(f"(?P<{p}>[^/]+)" if i % 2 else re.escape(p) for i, p in enumerate(parts))
        # `$` also matches before a final newline (a path ending in %0A), as Starlette's routes did.
        self.regex = re.compile(f"^{pattern}$")
        self._blocking = not inspect.iscoroutinefunction(endpoint)

    async def respond(self, request: Request) -> Response:
        if self._blocking:
            answer = await off_loop(functools.partial(self.endpoint, request))
        else:
            answer = self.endpoint(request)
        return answer if isinstance(answer, Response) else await answer


class Router:
    """An ASGI application over ``routes``, the first that matches a path answering."""

    def __init__(self, routes: Iterable[Route] = ()) -> None:
        self.routes = list(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        assert scope["type"] == "http", scope["type"]  # smlens' server sends no lifespan events
        path = scope["path"]
        refused: Route | None = None
        for route in self.routes:
            match = route.regex.match(path)
            if match is None:
                continue
            if scope["method"] in route.methods:
                response = await route.respond(Request(scope, match.groupdict()))
                await response(send)
                return
            refused = refused or route
        if refused is not None:
            allow = {"Allow": ", ".join(refused.methods)}
            await JSONResponse({"detail": "Method Not Allowed"}, 405, headers=allow)(send)
        elif (twin := self._twin(path)) is not None:
            # RFC 3986's query characters stay as sent (percent-escapes too); any other byte is escaped.
            query = quote_from_bytes(scope["query_string"], safe="!$&'()*+,;=:@/?%")
            redirect = Response(b"", 307)
            redirect.headers.append((b"location", (quote(twin) + (f"?{query}" if query else "")).encode()))
            await redirect(send)
        else:
            await JSONResponse({"detail": "Not Found"}, 404)(send)

    def _twin(self, path: str) -> str | None:
        """``path`` with its trailing slashes removed, or with one added, if a route has that path."""
        if path == "/":
            return None
        twin = path.rstrip("/") if path.endswith("/") else path + "/"
        if twin.startswith("//"):  # as a Location, it would name another host
            return None
        return twin if any(route.regex.match(twin) for route in self.routes) else None


@functools.cache
def _handler_pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(HANDLER_THREADS, thread_name_prefix="smlens-handler")


async def off_loop(work: Callable[[], T]) -> T:
    """Run ``work`` on the plain handlers' thread pool, the event loop serving other requests meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(
        _handler_pool(), contextvars.copy_context().run, work
    )
