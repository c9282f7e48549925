"""Every route's answer as a client sees it, from a real ``smlens serve --backend sim`` on loopback: status,
headers (all but Date) and body, for the pages, the errors (404, 405 with Allow, a bad query parameter),
HEAD, and paths with a trailing slash (not found: no redirect writes a client's Host header back). The
admin routes cannot be served with the sim backend, so they are pinned in process, on the application
``smlens serve`` builds, through the same guard the server puts in front of it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from conftest import REPO, free_port
from smlens.errors import BackendError
from smlens.exposition.rendered import Publisher
from smlens.verdicts import thresholds
from smlens.web.admin import add_profiling_admin
from smlens.web.app import create_app
from smlens.web.guard import Guard
from smlens.web.webconfig import PLAIN

STATIC = REPO / "exporter" / "smlens" / "web" / "status" / "static"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
PLAIN_TEXT = "text/plain; charset=utf-8"
NOT_FOUND = b'{"detail":"Not Found"}'
NOT_ALLOWED = b'{"detail":"Method Not Allowed"}'
NO_GPU = '{"error":"no GPU with index or uuid \'%s\' on this node"}'
# Nothing that asks for gzip: the answers compared byte for byte are the plain ones.
IDENTITY = {"Accept-Encoding": "identity"}


class Served:
    def __init__(self, port: int, process: subprocess.Popen[bytes]) -> None:
        self.port = port
        self.process = process
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", follow_redirects=False, timeout=10)

    def ask(self, method: str, path: str, **headers: str) -> httpx.Response:
        return self.http.request(method, path, headers={**IDENTITY, **headers})


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    port = free_port()
    log = tmp_path_factory.mktemp("routes") / "serve.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "smlens", "serve", "--backend", "sim", "--listen", f"127.0.0.1:{port}"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(REPO / "exporter")},
        )
    server = Served(port, process)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, log.read_text()
            try:
                if server.ask("GET", "/-/ready").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        yield server
    finally:
        process.terminate()
        process.wait(timeout=10)


def headers_of(response: httpx.Response, dated: bool = True) -> list[tuple[str, str]]:
    """The headers, sorted, but Date (the server gives every answer one; ``dated``), with Allow's methods
    sorted: Starlette lists them in the order of a set."""
    listed = []
    for name, value in response.headers.raw:
        key, text = name.decode().lower(), value.decode()
        if key == "date":
            continue
        if key == "allow":
            text = ", ".join(sorted(text.split(", ")))
        listed.append((key, text))
    assert len([1 for name, _ in response.headers.raw if name.lower() == b"date"]) == int(dated)
    return sorted(listed)


def fixed(body: bytes, content_type: str, *before: tuple[str, str]) -> list[tuple[str, str]]:
    return sorted([*before, ("content-length", str(len(body))), ("content-type", content_type)])


@pytest.mark.parametrize(
    ("method", "path", "status", "body", "content_type", "before"),
    [
        ("GET", "/-/healthy", 200, b"OK\n", PLAIN_TEXT, ()),
        ("GET", "/-/ready", 200, b"OK\n", PLAIN_TEXT, ()),
        ("GET", "/-/ready?anything=1", 200, b"OK\n", PLAIN_TEXT, ()),
        ("GET", "/nowhere", 404, NOT_FOUND, "application/json", ()),
        ("GET", "/metricsx", 404, NOT_FOUND, "application/json", ()),
        ("GET", "/static/", 404, NOT_FOUND, "application/json", ()),
        ("GET", "/static/a/b", 404, NOT_FOUND, "application/json", ()),
        ("GET", "/api/v1/gpus/x", 404, NOT_FOUND, "application/json", ()),
        ("POST", "/nowhere", 404, NOT_FOUND, "application/json", ()),
        ("GET", "/static/nope.js", 404, NOT_FOUND, "application/json", ()),
        ("POST", "/metrics", 405, NOT_ALLOWED, "application/json", (("allow", "GET, HEAD"),)),
        ("DELETE", "/-/ready", 405, NOT_ALLOWED, "application/json", (("allow", "GET, HEAD"),)),
        ("PUT", "/", 405, NOT_ALLOWED, "application/json", (("allow", "GET, HEAD"),)),
        ("OPTIONS", "/api/v1/history", 405, NOT_ALLOWED, "application/json", (("allow", "GET, HEAD"),)),
        ("FOO", "/static/status.js", 405, NOT_ALLOWED, "application/json", (("allow", "GET, HEAD"),)),
        ("GET", "/api/v1/gpus?gpu=99", 404, NO_GPU % "99", "application/json", ()),
        ("GET", "/api/v1/gpus?gpu=0&gpu=99", 404, NO_GPU % "99", "application/json", ()),  # the last counts
        ("GET", "/api/v1/gpus?gpu=", 404, NO_GPU % "", "application/json", ()),
        ("GET", "/api/v1/gpus?gpu=%C3%A9", 404, NO_GPU % "é", "application/json", ()),
    ],
)
def test_fixed_answers(
    served: Served,
    method: str,
    path: str,
    status: int,
    body: bytes | str,
    content_type: str,
    before: tuple[tuple[str, str], ...],
) -> None:
    response = served.ask(method, path)
    body = body.encode() if isinstance(body, str) else body
    assert (response.status_code, response.content) == (status, body)
    assert headers_of(response) == fixed(body, content_type, *before)


@pytest.mark.parametrize("after", ["abc", "-1", "+1", "", "1.5", "1e3", "%EF%BC%91"])
def test_a_bad_after_is_422_with_one_sentence(served: Served, after: str) -> None:
    response = served.ask("GET", f"/api/v1/history?after={after}")
    body = b'{"error":"after must be a sequence number (digits only)"}'
    assert (response.status_code, response.content) == (422, body)
    assert headers_of(response) == fixed(body, "application/json")


def test_the_page_and_its_files(served: Served) -> None:
    cached = (("content-security-policy", CSP), ("cache-control", "no-cache"))
    for path, name, content_type in (
        ("/", "index.html", "text/html; charset=utf-8"),
        ("/static/status.js", "status.js", "text/javascript; charset=utf-8"),
        ("/static/status.css", "status.css", "text/css; charset=utf-8"),
        ("/static/status%2Ejs", "status.js", "text/javascript; charset=utf-8"),
    ):
        body = (STATIC / name).read_bytes()
        response = served.ask("GET", path)
        assert (response.status_code, response.content) == (200, body), path
        expected = fixed(body, content_type, *cached)
        assert set(expected) <= set(headers_of(response)), path


def test_the_json_pages(served: Served) -> None:
    gpus = served.ask("GET", "/api/v1/gpus")
    assert gpus.status_code == 200 and len(gpus.json()["gpus"]) == 8
    assert headers_of(gpus) == fixed(gpus.content, "application/json")
    assert b" " not in gpus.content.split(b'"model":')[0]  # compact: no blanks after separators
    one = served.ask("GET", "/api/v1/gpus?gpu=99&gpu=%33")  # the last value counts, %-decoded
    assert [g["index"] for g in one.json()["gpus"]] == [3]
    history = served.ask("GET", "/api/v1/history?after=1")
    assert history.status_code == 200 and history.json()["series"]
    assert headers_of(history) == fixed(history.content, "application/json", ("cache-control", "no-store"))


def test_metrics_plain_openmetrics_and_gzip(served: Served) -> None:
    plain = served.ask("GET", "/metrics")
    assert plain.status_code == 200 and b"\ngpu_up{" in plain.content
    assert headers_of(plain) == fixed(
        plain.content, "text/plain; version=0.0.4; charset=utf-8", ("vary", "Accept-Encoding")
    )
    deadline = time.monotonic() + 10  # the first scrape asking for it gets text; the next tick renders it
    while (
        not (om := served.ask("GET", "/metrics", Accept="application/openmetrics-text"))
        .headers["content-type"]
        .startswith("application/openmetrics-text")
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    assert om.content.endswith(b"# EOF\n")
    assert headers_of(om) == fixed(
        om.content, "application/openmetrics-text; version=1.0.0; charset=utf-8", ("vary", "Accept-Encoding")
    )
    zipped = served.http.get("/metrics", headers={"Accept-Encoding": "gzip"})
    length = zipped.headers["content-length"]
    assert b"\ngpu_up{" in zipped.content and int(length) < len(zipped.content)
    assert headers_of(zipped) == sorted(
        [
            ("content-encoding", "gzip"),
            ("vary", "Accept-Encoding"),
            ("content-length", length),
            ("content-type", "text/plain; version=0.0.4; charset=utf-8"),
        ]
    )


@pytest.mark.parametrize(
    "path", ["/", "/metrics", "/-/healthy", "/api/v1/gpus?gpu=99", "/nowhere", "/metrics/"]
)
def test_head_answers_as_get_without_a_body(served: Served, path: str) -> None:
    get, head = served.ask("GET", path), served.ask("HEAD", path)
    assert (head.status_code, head.content) == (get.status_code, b"")
    names = [name for name, _ in headers_of(get)]
    assert [name for name, _ in headers_of(head)] == names
    if path != "/metrics":  # the exposition changes from one tick to the next
        assert headers_of(head) == headers_of(get)


@pytest.mark.parametrize(
    "path",
    [
        "/metrics/",
        "/metrics///",
        "/metrics/?name=a%20b&x",
        "/static/nope/",
        "/api/v1/gpus/",
        "/-/healthy/",
    ],
)
@pytest.mark.parametrize("host", ["127.0.0.1", "exporter.example:8080", "evil.example", "bad/host", ""])
def test_a_trailing_slash_is_not_found_and_never_redirected_to_the_host(
    served: Served, path: str, host: str
) -> None:
    response = served.ask("GET", path, Host=host)
    assert (response.status_code, response.content) == (404, NOT_FOUND)
    assert "location" not in response.headers


class Control:
    def __init__(self) -> None:
        self.paused = False
        self.error: BackendError | None = None

    def pause_profiling(self) -> None:
        if self.error is not None:
            raise self.error
        self.paused = True

    def resume_profiling(self) -> None:
        self.paused = False


TOKEN = "a-token-of-more-than-16-characters"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def test_admin_answers(tmp_path: Path) -> None:
    control = Control()
    app = create_app(Publisher(), thresholds.load(), lambda: True)
    add_profiling_admin(app, control, TOKEN)
    http = TestClient(Guard(app, lambda: PLAIN), base_url="http://127.0.0.1:10132", follow_redirects=False)

    def check(
        method: str, path: str, status: int, body: object, *before: tuple[str, str], **headers: str
    ) -> None:
        response = http.request(method, path, headers=headers)
        raw = json.dumps(body, separators=(",", ":")).encode()
        assert (response.status_code, response.content) == (status, raw), (method, path)
        assert headers_of(response, dated=False) == fixed(raw, "application/json", *before), (method, path)

    denied = {"error": "this endpoint needs a valid 'Authorization: Bearer <token>' or X-Admin-Token header"}
    check("GET", "/admin/profiling", 401, denied, ("www-authenticate", "Bearer"))
    check(
        "POST",
        "/admin/profiling/pause",
        401,
        denied,
        ("www-authenticate", "Bearer"),
        **BEARER | {"Authorization": "Bearer x"},
    )
    check("GET", "/admin/profiling", 200, {"paused": False}, **BEARER)
    check("POST", "/admin/profiling/pause", 200, {"paused": True}, **BEARER)
    check("POST", "/admin/profiling/pause", 200, {"paused": True}, **{"X-Admin-Token": TOKEN})
    check("POST", "/admin/profiling/resume", 200, {"paused": False}, **BEARER)
    check("GET", "/admin/profiling/pause", 405, {"detail": "Method Not Allowed"}, ("allow", "POST"), **BEARER)
    check("POST", "/admin/profiling", 405, {"detail": "Method Not Allowed"}, ("allow", "GET, HEAD"))
    check("GET", "/admin", 404, {"detail": "Not Found"})
    for reason, status in (("not_supported", 409), ("hostengine_unreachable", 503)):
        control.error = BackendError(f"cannot pause: {reason}", reason=reason)
        answer = {"error": str(control.error), "reason": reason}
        check("POST", "/admin/profiling/pause", status, answer, **BEARER)
    head = http.head("/admin/profiling", headers=BEARER)
    assert (head.status_code, head.content, head.headers["content-length"]) == (200, b"", "16")
    slash = http.post("/admin/profiling/pause/", headers=BEARER)
    assert (slash.status_code, slash.json()) == (404, {"detail": "Not Found"})


def raw(served: Served, request_line: str) -> tuple[str, bytes]:
    """The status line and body of one request sent as written (httpx would normalise the method and path)."""
    with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
        sock.sendall(f"{request_line}\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode(), body


@pytest.mark.parametrize(
    ("request_line", "status", "body"),
    [
        ("get /metrics HTTP/1.1", "HTTP/1.1 405 Method Not Allowed", NOT_ALLOWED),
        ("GET // HTTP/1.1", "HTTP/1.1 404 Not Found", NOT_FOUND),
        ("OPTIONS * HTTP/1.1", "HTTP/1.1 404 Not Found", NOT_FOUND),
        ("GET http://127.0.0.1/-/healthy HTTP/1.1", "HTTP/1.1 404 Not Found", NOT_FOUND),
        (
            "GET /-/healthy%0A HTTP/1.1",
            "HTTP/1.1 200 OK",
            b"OK\n",
        ),  # Starlette's `$` matched before a newline
        ("GET /-/healthy HTTP/1.0", "HTTP/1.1 200 OK", b"OK\n"),
    ],
)
def test_requests_as_sent(served: Served, request_line: str, status: str, body: bytes) -> None:
    assert raw(served, request_line) == (status, body)
