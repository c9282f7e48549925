"""smlens.routing in process: where handlers run, what a handler reads of its request, and a failing handler
left to the HTTP layer (tests/test_http_routes.py pins every answer through the real server)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from smlens.asgi import Message
from smlens.routing import JSONResponse, PlainTextResponse, Request, Response, Route, Router


def scope(path: str, query: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    return {
        "type": "http",
        "method": "GET",
        "path": path,
        "query_string": query,
        "headers": headers or [],
        "scheme": "http",
        "server": ("127.0.0.1", 10132),
    }


async def call(app: Router, request: dict[str, Any]) -> list[Message]:
    sent: list[Message] = []

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: Message) -> None:
        sent.append(message)

    await app(request, receive, send)
    return sent


def test_a_plain_handler_runs_off_the_event_loop_and_does_not_hold_it_up() -> None:
    release = threading.Event()
    threads: dict[str, int] = {}
    names: dict[str, str] = {}

    def slow(request: Request) -> Response:
        threads["slow"] = threading.get_ident()
        names["slow"] = threading.current_thread().name
        release.wait(10)
        return PlainTextResponse("slow")

    async def quick(request: Request) -> Response:
        threads["quick"] = threading.get_ident()
        return PlainTextResponse("quick")

    app = Router([Route("/slow", slow), Route("/quick", quick)])

    async def both() -> tuple[list[Message], list[Message]]:
        waiting = asyncio.create_task(call(app, scope("/slow")))
        await asyncio.sleep(0.05)
        answered = await asyncio.wait_for(call(app, scope("/quick")), 5)  # while /slow still blocks
        assert not waiting.done()
        release.set()
        return answered, await waiting

    quick_sent, slow_sent = asyncio.run(both())
    assert (quick_sent[1]["body"], slow_sent[1]["body"]) == (b"quick", b"slow")
    assert threads["quick"] == threading.get_ident()  # asyncio.run's loop runs on this thread
    assert threads["slow"] != threading.get_ident()
    assert names["slow"].startswith("smlens-handler")  # not asyncio's default pool, which the guard uses


def test_a_handler_reads_the_first_header_and_the_last_query_value() -> None:
    seen: list[tuple[str, str | None, str]] = []

    async def echo(request: Request) -> Response:
        seen.append(
            (request.headers.get("accept", ""), request.query_params.get("gpu"), request.path_params["x"])
        )
        return Response()

    headers = [(b"accept", b"text/plain"), (b"accept", b"application/json")]
    asyncio.run(call(Router([Route("/a/{x}", echo)]), scope("/a/é", b"gpu=1&gpu=a+b%21&other", headers)))
    assert seen == [("text/plain", "a b!", "é")]


def test_a_failing_handler_is_left_to_the_http_layer() -> None:
    # serving/http11.py answers 500 "Internal Server Error" and closes (tests/test_http11.py)
    async def broken(request: Request) -> Response:
        raise RuntimeError("broken")

    with pytest.raises(RuntimeError, match="broken"):
        asyncio.run(call(Router([Route("/", broken)]), scope("/")))


def test_a_redirect_without_a_server_address_is_relative() -> None:
    request = {**scope("/metrics/", b"a=1"), "server": None}
    start = asyncio.run(call(Router([Route("/metrics", lambda _: Response())]), request))[0]
    assert (start["status"], dict(start["headers"])[b"location"]) == (307, b"/metrics?a=1")


def test_a_redirect_escapes_what_a_location_cannot_carry() -> None:
    request = scope("/metrics/", "a=é b&c=%41/?:@!$'()*+,;".encode("latin-1"))
    start = asyncio.run(call(Router([Route("/metrics", lambda _: Response())]), request))[0]
    assert dict(start["headers"])[b"location"] == b"/metrics?a=%E9%20b&c=%41/?:@!$'()*+,;"


def test_no_redirect_to_a_location_that_would_name_another_host() -> None:
    request = scope("//evil.example/")
    start = asyncio.run(call(Router([Route("//evil.example", lambda _: Response())]), request))[0]
    assert start["status"] == 404


def test_headers_a_handler_gives_are_not_repeated() -> None:
    response = Response(
        b"a,b\n", headers={"Content-Type": "text/csv", "Content-Length": "4"}, media_type="text/plain"
    )
    assert response.headers == [(b"content-type", b"text/csv"), (b"content-length", b"4")]


def test_methods_are_listed_once_in_upper_case() -> None:
    async def ok(request: Request) -> Response:
        return Response()

    post = {**scope("/x"), "method": "POST"}
    for methods in (["GET", "HEAD"], ["get", "head", "GET"], ["GET"]):
        start = asyncio.run(call(Router([Route("/x", ok, methods=methods)]), post))[0]
        assert (start["status"], dict(start["headers"])[b"allow"]) == (405, b"GET, HEAD"), methods


def test_json_with_text_that_is_not_valid_costs_its_bad_bytes_not_the_answer() -> None:
    assert JSONResponse({"pod": "train\udcff"}).body == b'{"pod":"train?"}'
