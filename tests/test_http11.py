"""smlens' HTTP/1.1 protocol (serving/http11.py) under the whole server: WebServer on a loopback port,
raw sockets as clients, and a small ASGI application that shows what it received."""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections.abc import Callable
from email.utils import formatdate, parsedate_to_datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from smlens.asgi import Receive, Scope, Send
from smlens.web import http11
from smlens.web.connections import Limits
from smlens.web.server import WebServer, bind
from smlens.web.webconfig import PLAIN, WebConfig, load_web_config
from tls_support import TestCA

T = TypeVar("T")
seen: list[dict[str, Any]] = []


async def echo(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers ``METHOD PATH BODY-LENGTH BODY``; /boom... fails before the response, /late after starting it,
    /disconnect waits for the connection to go and records what receive gave then, /noread answers without
    reading the body, /slow answers after 0.5 s."""
    seen.append(dict(scope))
    if scope["path"].startswith("/boom"):
        raise RuntimeError("boom")
    if scope["path"] == "/noread":
        await send({"type": "http.response.start", "status": 405, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})
        return
    if scope["path"] == "/slow":
        await asyncio.sleep(0.5)
    if scope["path"] == "/late":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        raise RuntimeError("late")
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/disconnect":
        seen.append(await receive())
        return
    out = f"{scope['method']} {scope['path']} {len(body)} ".encode() + body
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(out)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": out})


def served(
    client: Callable[[int], T],
    server_out: list[WebServer] | None = None,
    web_config: WebConfig = PLAIN,
    header_timeout: float = 5,
) -> T:
    """Runs ``client(port)`` in a thread while a WebServer serves :func:`echo` on a loopback port."""
    seen.clear()
    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    limits = Limits(header_timeout=header_timeout, idle_timeout=5, response_timeout=5)
    server = WebServer(sock, limits, web_config)
    if server_out is not None:
        server_out.append(server)

    async def main() -> T:
        started = asyncio.Event()
        serving = asyncio.create_task(server.serve(echo, started.set))
        await started.wait()
        try:
            return await asyncio.to_thread(client, port)
        finally:
            server.stop()
            await serving

    return asyncio.run(main())


def exchange(port: int, *chunks: bytes, pause: float = 0.0) -> bytes:
    """Sends ``chunks`` (``pause`` seconds apart) on one connection; everything read until it closes (a reset
    after the answer included: the server closes with what it did not read left unread)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        for chunk in chunks:
            sock.sendall(chunk)
            time.sleep(pause)
        received = b""
        try:
            while data := sock.recv(65536):
                received += data
        except ConnectionResetError:
            pass
    return received


def test_two_pipelined_requests_in_one_write_are_answered_in_order() -> None:
    both = (
        b"GET /first HTTP/1.1\r\nHost: x\r\n\r\nGET /second HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    received = served(lambda port: exchange(port, both))
    assert received.count(b"HTTP/1.1 200 OK\r\n") == 2
    assert received.index(b"GET /first 0 ") < received.index(b"GET /second 0 ")
    assert received.endswith(b"GET /second 0 ")


def test_head_gets_the_headers_of_get_and_no_body() -> None:
    requests = (
        b"HEAD /page HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /next HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    received = served(lambda port: exchange(port, *requests, pause=0.2))
    head, _, rest = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"content-length: 12" in head.split(b"\r\n")  # len(b"GET /page 0 "): the body of a GET
    assert rest.startswith(b"HTTP/1.1 200 OK\r\n")  # the next response, no body in between
    assert rest.endswith(b"GET /next 0 ")


def test_a_body_arriving_in_pieces_reaches_the_application_whole() -> None:
    length = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nConnection: close\r\n\r\n"
    received = served(lambda port: exchange(port, length + b"hello", b"world", pause=0.3))
    assert received.endswith(b"\r\n\r\nPOST /echo 10 helloworld")
    chunked = (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhel",
        b"lo\r\n5\r\nworld\r\n",
        b"0\r\n\r\n",
    )
    received = served(lambda port: exchange(port, *chunked, pause=0.3))
    assert received.endswith(b"POST /echo 10 helloworld")


def test_a_body_larger_than_the_read_buffer_and_100_continue() -> None:
    big = bytes(range(256)) * 1024  # 256 KiB: reading pauses above 64 KiB not yet taken
    head = f"PUT /big HTTP/1.1\r\nHost: x\r\nContent-Length: {len(big)}\r\nConnection: close\r\n\r\n"
    received = served(lambda port: exchange(port, head.encode(), big))
    assert received.endswith(b"PUT /big 262144 " + big)

    def expect_continue(port: int) -> bytes:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            head = b"POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n"
            sock.sendall(head + b"Expect: 100-continue\r\n\r\n")
            received = sock.recv(4096)  # the client sends its body only when told to
            sock.sendall(b"ok")
            while data := sock.recv(4096):
                received += data
            return received

    received = served(expect_continue)
    assert received.startswith(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n")
    assert received.endswith(b"POST /c 2 ok")


def test_the_scope_is_asgi3_http() -> None:
    request = b"GET /a%20b/c?x=1&y=%20 HTTP/1.1\r\nHost: h\r\nX-Mixed-Case: V\r\nConnection: close\r\n\r\n"
    served(lambda port: exchange(port, request))
    (scope,) = seen
    assert scope["type"] == "http" and scope["asgi"] == {"version": "3.0", "spec_version": "2.3"}
    assert (scope["http_version"], scope["method"], scope["scheme"]) == ("1.1", "GET", "http")
    assert (scope["path"], scope["raw_path"], scope["query_string"]) == ("/a b/c", b"/a%20b/c", b"x=1&y=%20")
    assert scope["root_path"] == ""
    assert scope["headers"] == [(b"host", b"h"), (b"x-mixed-case", b"V"), (b"connection", b"close")]
    assert scope["client"][0] == "127.0.0.1" and scope["server"][0] == "127.0.0.1"


def test_an_application_error_is_a_500_before_the_response_and_a_close_after(
    caplog: pytest.LogCaptureFixture,
) -> None:
    request = b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n"  # keep-alive asked: the 500 closes it anyway
    with caplog.at_level(logging.ERROR, "smlens.web.http11"):
        received = served(lambda port: exchange(port, request))
    assert received.startswith(b"HTTP/1.1 500 Internal Server Error\r\n")
    assert b"connection: close\r\n" in received.lower()
    assert received.endswith(b"\r\n\r\nInternal Server Error\n")
    (record,) = [r for r in caplog.records if r.name == "smlens.web.http11"]
    assert record.exc_info is not None and "GET '/boom'" in record.getMessage()

    late = served(lambda port: exchange(port, b"GET /late HTTP/1.1\r\nHost: x\r\n\r\n"))
    assert late.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in late.lower()
    assert b"partial" in late and not late.endswith(b"0\r\n\r\n")  # closed without the last chunk


def test_the_application_hears_of_a_lost_connection() -> None:
    def leave(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"GET /disconnect HTTP/1.1\r\nHost: x\r\n\r\n")
            time.sleep(0.3)
        deadline = time.monotonic() + 5
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)

    served(leave)
    assert seen[1] == {"type": "http.disconnect"}


def test_an_oversized_head_gets_431_and_is_counted_as_malformed() -> None:
    servers: list[WebServer] = []
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20000  # incomplete: h11 waits for more
    received = served(lambda port: exchange(port, head), servers)
    assert received.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    garbage = served(lambda port: exchange(port, b"\x00\x01 not http\r\n\r\n"), servers)
    assert garbage.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert [s.stats.malformed_requests for s in servers] == [1, 1]
    assert seen == []  # neither reached the application


def test_over_tls_the_scheme_is_https_and_a_stalled_handshake_is_closed(tmp_path: Path) -> None:
    ca = TestCA(tmp_path)
    server_cert = ca.issue("server", ["localhost", "127.0.0.1"])
    path = tmp_path / "web.yml"
    tls = {"cert_file": str(server_cert.cert), "key_file": str(server_cert.key)}
    path.write_text(yaml.safe_dump({"tls_server_config": tls}))
    context = ssl.create_default_context(cafile=str(ca.path))

    def client(port: int) -> tuple[bytes, float]:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
            context.wrap_socket(raw, server_hostname="localhost") as sock,
        ):
            sock.sendall(b"GET /tls HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            received = b""
            while data := sock.recv(4096):
                received += data
        with socket.create_connection(("127.0.0.1", port), timeout=5) as stalled:
            stalled.sendall(b"\x16\x03\x01")  # the start of a ClientHello, never finished
            started = time.monotonic()
            while stalled.recv(4096):
                pass
        return received, time.monotonic() - started

    servers: list[WebServer] = []
    received, stalled_for = served(client, servers, load_web_config(path), header_timeout=1)
    assert received.endswith(b"GET /tls 0 ")
    assert seen[0]["scheme"] == "https"
    assert stalled_for < 3
    assert servers[0].stats.closed["tls_handshake"] == 1


def test_a_chunk_not_ended_by_crlf_is_refused() -> None:
    servers: list[WebServer] = []
    request = b"POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n"
    received = served(lambda port: exchange(port, request), servers)
    assert received.startswith(b"HTTP/1.1 400 Bad Request\r\n")  # h11 < 0.16 took any two bytes there
    assert servers[0].stats.malformed_requests == 1


def test_content_length_with_transfer_encoding_is_refused() -> None:
    servers: list[WebServer] = []
    # A proxy framing by Content-Length would forward "\r\nGET /smuggled ..." as the next request.
    request = (
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
        b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    )
    received = served(lambda port: exchange(port, request), servers)
    assert received.startswith(b"HTTP/1.1 400 Bad Request\r\n") and received.count(b"HTTP/1.1") == 1
    assert seen == [] and servers[0].stats.malformed_requests == 1


def test_a_response_before_the_body_arrived_closes_the_connection() -> None:
    def told_no(port: int) -> bytes:
        """A client waiting for 100-continue gets a final answer instead: it sends no body, but a request."""
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            head = b"POST /noread HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\nExpect: 100-continue\r\n"
            sock.sendall(head + b"\r\n")
            received = sock.recv(4096)
            sock.sendall(b"GET /next HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            try:
                while data := sock.recv(4096):
                    received += data
            except ConnectionResetError:  # the server closed with the request unread
                pass
            return received

    servers: list[WebServer] = []
    received = served(told_no, servers)
    assert received.startswith(b"HTTP/1.1 405 Method Not Allowed\r\n")
    assert b"connection: close" in received.lower() and received.count(b"HTTP/1.1") == 1
    assert [s["path"] for s in seen] == ["/noread"] and servers[0].stats.malformed_requests == 0

    def streams_on(port: int) -> int:
        """Bytes of an unread body the server took after answering, before it closed."""
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"POST /noread HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 405")
            sent, chunk = 0, bytes(65536)
            try:
                while sent < 256 * 1024 * 1024:
                    sock.sendall(chunk)
                    sent += len(chunk)
            except OSError:  # reset by the server
                pass
            return sent

    assert served(streams_on) < 64 * 1024 * 1024


def test_bytes_after_a_request_that_closes_are_ignored_and_not_read() -> None:
    servers: list[WebServer] = []
    request = b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    received = served(lambda port: exchange(port, request, b"\r\n", pause=0.2), servers)  # a stray CRLF
    assert received.startswith(b"HTTP/1.1 200 OK\r\n") and received.endswith(b"GET /slow 0 ")
    assert servers[0].stats.malformed_requests == 0

    def streams_on(port: int) -> tuple[int, bytes]:
        """Bytes the server let in after the request while answering it, and the answer."""
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(request)
            sent, chunk = 0, bytes(65536)
            try:
                while sent < 256 * 1024 * 1024:
                    sock.sendall(chunk)
                    sent += len(chunk)
            except OSError:  # the socket buffers are full (a timeout), or the server answered and closed
                pass
            return sent, sock.recv(4096)

    sent, answer = served(streams_on)
    assert sent < 64 * 1024 * 1024 and answer.startswith(b"HTTP/1.1 200 OK\r\n")


def test_a_complete_head_over_the_limit_gets_431_however_it_arrives() -> None:
    servers: list[WebServer] = []
    fields = b"".join(b"X-%d: v\r\n" % n for n in range(2500))  # 20 KiB in one write: one read, complete
    head = b"GET / HTTP/1.1\r\nHost: x\r\n" + fields + b"\r\n"
    received = served(lambda port: exchange(port, head), servers)
    assert received.startswith(b"HTTP/1.1 431 Request Header Fields Too Large\r\n")
    assert seen == [] and servers[0].stats.malformed_requests == 1
    at_limit = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 15000 + b"\r\nConnection: close\r\n\r\n"
    assert served(lambda port: exchange(port, at_limit)).startswith(b"HTTP/1.1 200 OK\r\n")


def test_a_request_path_cannot_forge_log_lines(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, "smlens.web.http11"):
        served(lambda port: exchange(port, b"GET /boom%0d%0aFORGED:%20line HTTP/1.1\r\nHost: x\r\n\r\n"))
    (record,) = [r for r in caplog.records if r.name == "smlens.web.http11"]
    assert "\n" not in record.getMessage() and "\r" not in record.getMessage()


def test_the_date_is_what_email_utils_would_write() -> None:
    days = range(1_700_000_000, 1_700_000_000 + 400 * 86400, 86400 + 3599)  # every weekday, month, hour
    seconds = [0, 951782400, 2**31, 4102444799, *days]  # 1970, 2000-02-29, 2038, 2099-12-31 23:59:59
    for second in seconds:
        assert http11._http_date(second) == (b"date", formatdate(second, usegmt=True).encode()), second


def test_every_response_has_a_date() -> None:
    ok = served(lambda port: exchange(port, b"GET /d HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    refused = served(lambda port: exchange(port, b"\x00 not http\r\n\r\n"))
    for received in (ok, refused):
        fields = dict(line.split(b": ", 1) for line in received.partition(b"\r\n\r\n")[0].split(b"\r\n")[1:])
        date = parsedate_to_datetime(fields[b"date"].decode())
        assert abs(date.timestamp() - time.time()) < 5 and fields[b"date"].endswith(b" GMT")
