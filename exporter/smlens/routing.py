"""smlens' routes as one ASGI application: path templates, methods (HEAD with every GET), the 405 with its
``Allow``, the 404, and the redirect of a path that matches a route once a trailing slash is added or
removed; each answer as the Starlette routes this replaced gave it (tests/test_http_routes.py pins them).

A plain (not async) handler runs on asyncio's default thread pool, so that a slow one never holds up the
event loop that serves /metrics.
"""

from __future__ import annotations

import asyncio
import inspect
import ipaddress
import json
import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import cached_property
from typing import Any
from urllib.parse import parse_qsl, quote

from smlens.asgi import Receive, Scope, Send

_PARAMETER = re.compile(r"{([A-Za-z_][A-Za-z0-9_]*)}")
# A Host header that is a host: a name, an IPv6 literal or an IPvFuture (RFC 3986 3.2.2), an optional port.
_HOST = re.compile(
    r"(?P<host>[a-z0-9._~%!$&'()*+,;=-]+"
    r"|\[(?:(?P<ipv6>[a-f0-9]*:[a-f0-9.:]+)|(?-i:v)[a-f0-9]+\.[a-z0-9._~!$&'()*+,;=:-]+)\])"
    r"(?::(?P<port>[0-9]+))?",
    re.IGNORECASE,
)
_DEFAULT_PORTS = {"http": 80, "https": 443}


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
        self.headers.append((b"content-length", str(len(self.body)).encode()))
        if kind is not None:
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
        # NaN and infinities are not JSON: refused (a 500), never sent.
        return json.dumps(content, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode()


Handler = Callable[[Request], "Response | Awaitable[Response]"]


class Route:
    """``path`` may hold ``{name}`` parts, each one path segment, given to the handler as a path parameter."""

    def __init__(self, path: str, endpoint: Handler, methods: Iterable[str] = ("GET",)) -> None:
        self.path = path
        self.endpoint = endpoint
        methods = tuple(methods)
        self.methods = (*methods, "HEAD") if "GET" in methods else methods
        parts = _PARAMETER.split(path)  # literal, name, literal, ...
        pattern = "".join(f"(?P<{p}>[^/]+)" if i % 2 else re.escape(p) for i, p in enumerate(parts))
        # `$` also matches before a final newline (a path ending in %0A), as Starlette's routes did.
        self.regex = re.compile(f"^{pattern}$")
        self._blocking = not inspect.iscoroutinefunction(endpoint)

    async def respond(self, request: Request) -> Response:
        if self._blocking:
            answer = await asyncio.to_thread(self.endpoint, request)
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
            redirect = Response(b"", 307)
            redirect.headers.append((b"location", _url(scope, twin).encode("latin-1")))
            await redirect(send)
        else:
            await JSONResponse({"detail": "Not Found"}, 404)(send)

    def _twin(self, path: str) -> str | None:
        """``path`` with its trailing slashes removed, or with one added, if a route has that path."""
        if path == "/":
            return None
        twin = path.rstrip("/") if path.endswith("/") else path + "/"
        return twin if any(route.regex.match(twin) for route in self.routes) else None


def _url(scope: Scope, path: str) -> str:
    """The absolute URL of ``path`` on this server, with the request's query."""
    path = path.replace("?", "%3F").replace("#", "%23").replace("\\", "%5C")
    authority = _authority(scope)
    url = f"{_scheme(scope)}://{authority}{path}" if authority is not None else path
    query = scope["query_string"].decode()
    return quote(f"{url}?{query}" if query else url, safe=":/%#?=@[]!$&'()*+,;")


def _authority(scope: Scope) -> str | None:
    """The Host the client asked for when it is a host (with a valid port), else the server's address."""
    host = next((value.decode("latin-1") for name, value in scope["headers"] if name == b"host"), None)
    match = None if host is None else _HOST.fullmatch(host)
    if match is not None and _valid(match["ipv6"], match["port"]):
        return host
    server = scope.get("server")
    if server is None:
        return None
    name, port = server
    name = f"[{name}]" if ":" in name and not name.startswith("[") else name
    return name if _DEFAULT_PORTS[_scheme(scope)] == port else f"{name}:{port}"


def _scheme(scope: Scope) -> str:
    return str(scope.get("scheme", "http"))


def _valid(ipv6: str | None, port: str | None) -> bool:
    digits = None if port is None else port.lstrip("0")
    if digits is not None and (len(digits) > 5 or int(digits or "0") > 65535):
        return False
    if ipv6 is not None:
        try:
            ipaddress.IPv6Address(ipv6)
        except ipaddress.AddressValueError:
            return False
    return True
