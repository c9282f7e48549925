"""`smlens report`'s connection options and its refusals: TLS (a CA, a client certificate, a server
name, skipping verification) and basic auth against a Prometheus that requires them, a bearer token
through an auth-checking proxy; and one sentence, exit 1 and no traceback for an unreachable port, a
server that is not Prometheus, a Prometheus without smlens' series, a bad range and bad options."""

from __future__ import annotations

import functools
import json
import re
import ssl
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import bcrypt
import httpx
import pytest

from accounting_history import History, copy_blocks, serve, served
from conftest import free_port, run_cli
from tls_support import TestCA

USER, PASSWORD, TOKEN = "report", "s3cret-password", "t0ken-of-the-report"
SERVER_NAME = "prometheus.test"  # the only name the server certificate is valid for


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[History, str, Path]]:
    with served(tmp_path_factory.mktemp("report-errors"), ["--storage.tsdb.retention.time=10d"]) as found:
        yield found


def report(*args: str) -> tuple[int, str, str]:
    result = run_cli("report", *args)
    assert "Traceback" not in result.stderr
    return result.returncode, result.stdout, result.stderr


def refusal(*args: str) -> str:
    """The one line of a report that fails."""
    code, stdout, stderr = report(*args)
    assert code == 1, stderr
    assert stdout == "" and stderr.count("\n") == 1 and stderr.startswith("smlens: "), stderr
    return stderr.strip()


def range_of(history: History) -> list[str]:
    return ["--since", str(history.start + 600), "--until", str(history.end - 600)]


def plain_rows(history: History, url: str) -> list[dict[str, Any]]:
    code, stdout, stderr = report("--prometheus", url, "--format", "json", *range_of(history))
    assert code == 0, stderr
    rows: list[dict[str, Any]] = json.loads(stdout)
    assert rows
    return rows


# -- TLS and basic auth, as Prometheus' own web config requires them ----------------------------------


class Tls:
    def __init__(self, directory: Path) -> None:
        ca = TestCA(directory)
        self.ca = ca.path
        self.server = ca.issue("server", [SERVER_NAME])
        self.client = ca.issue("client", ["smlens-report"], client=True)
        self.password = directory / "password"
        self.password.write_text(PASSWORD + "\n")
        self.wrong = directory / "wrong-password"
        self.wrong.write_text("not-the-password\n")


@pytest.fixture(scope="module")
def tls_prometheus(
    stack: tuple[History, str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Tls]]:
    """The same blocks behind TLS with a required client certificate and basic auth."""
    directory = tmp_path_factory.mktemp("report-tls")
    tls = Tls(directory)
    copy_blocks(stack[2], directory / "data")
    web_config = {
        "tls_server_config": {
            "cert_file": str(tls.server.cert),
            "key_file": str(tls.server.key),
            "client_auth_type": "RequireAndVerifyClientCert",
            "client_ca_file": str(tls.ca),
        },
        "basic_auth_users": {USER: bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()},
    }
    context = ssl.create_default_context(cafile=str(tls.ca))
    context.check_hostname = False
    context.load_cert_chain(str(tls.client.cert), str(tls.client.key))
    client = {"verify": context, "auth": (USER, PASSWORD)}
    with serve(directory / "prometheus", directory / "data", web_config, client) as url:
        yield url, tls


def tls_args(tls: Tls, *leave_out: str) -> list[str]:
    args = {
        "--ca-file": str(tls.ca),
        "--server-name": SERVER_NAME,
        "--cert-file": str(tls.client.cert),
        "--key-file": str(tls.client.key),
        "--basic-auth-user": USER,
        "--basic-auth-password-file": str(tls.password),
    }
    return [item for flag, value in args.items() if flag not in leave_out for item in (flag, value)]


def test_tls_with_a_client_certificate_a_server_name_and_basic_auth(
    stack: tuple[History, str, Path], tls_prometheus: tuple[str, Tls]
) -> None:
    history, plain, _ = stack
    url, tls = tls_prometheus
    assert url.startswith("https://127.0.0.1:")
    code, stdout, stderr = report("--prometheus", url, "--format", "json", *range_of(history), *tls_args(tls))
    assert code == 0, stderr
    assert json.loads(stdout) == plain_rows(history, plain)


def test_insecure_skip_verify_needs_no_ca_nor_server_name(
    stack: tuple[History, str, Path], tls_prometheus: tuple[str, Tls]
) -> None:
    url, tls = tls_prometheus
    args = tls_args(tls, "--ca-file", "--server-name")
    code, _stdout, stderr = report("--prometheus", url, *range_of(stack[0]), *args, "--insecure-skip-verify")
    assert code == 0, stderr


@pytest.mark.parametrize(
    ("leave_out", "words"),
    [
        (("--ca-file",), r"failed \(certificate verify failed: unable to get local issuer certificate\)"),
        (("--server-name",), r"failed \(certificate verify failed: IP address mismatch"),
        # The server's alert: "bad certificate" (TLS 1.2) or "certificate required" (1.3), as Go sends it.
        (
            ("--cert-file", "--key-file"),
            r"failed \((sslv3 alert bad certificate|tlsv13 alert certificate required)\)",
        ),
    ],
)
def test_a_tls_failure_is_one_sentence(
    tls_prometheus: tuple[str, Tls], leave_out: tuple[str, ...], words: str
) -> None:
    url, tls = tls_prometheus
    line = refusal("--prometheus", url, *tls_args(tls, *leave_out))
    assert re.match(re.escape(f"smlens: TLS with Prometheus at {url} ") + words, line), line
    assert line.endswith(
        "check --ca-file, --server-name, --cert-file and --key-file, or --insecure-skip-verify."
    )


def test_basic_auth_refused_or_missing(tls_prometheus: tuple[str, Tls]) -> None:
    url, tls = tls_prometheus
    wrong = [*tls_args(tls, "--basic-auth-password-file"), "--basic-auth-password-file", str(tls.wrong)]
    assert refusal("--prometheus", url, *wrong) == (
        f"smlens: Prometheus at {url} refused the credentials (HTTP 401 Unauthorized): check "
        "--bearer-token-file, or --basic-auth-user and --basic-auth-password-file."
    )
    missing = tls_args(tls, "--basic-auth-user", "--basic-auth-password-file")
    assert refusal("--prometheus", url, *missing) == (
        f"smlens: Prometheus at {url} asks for credentials (HTTP 401 Unauthorized): pass "
        "--bearer-token-file, or --basic-auth-user with --basic-auth-password-file."
    )


# -- a bearer token, through a proxy that checks it ---------------------------------------------------


class BearerProxy:
    """Plain HTTP in front of a Prometheus: requests without ``Authorization: Bearer TOKEN`` get 401."""

    def __init__(self, upstream: str) -> None:
        self.authorizations: list[str | None] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def _forward(self) -> None:
                proxy.authorizations.append(self.headers.get("Authorization"))
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self._send(401, b"Unauthorized\n", "text/plain")
                    return
                length = int(self.headers.get("Content-Length") or 0)
                answer = httpx.request(
                    self.command,
                    upstream + self.path,
                    content=self.rfile.read(length) if length else None,
                    headers={"Content-Type": self.headers.get("Content-Type", "")},
                    timeout=30,
                )
                self._send(answer.status_code, answer.content, answer.headers.get("content-type", ""))

            def _send(self, status: int, body: bytes, kind: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _forward

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def bearer_proxy(stack: tuple[History, str, Path]) -> Iterator[BearerProxy]:
    proxy = BearerProxy(stack[1])
    yield proxy
    proxy.close()


def test_a_bearer_token_from_a_file_goes_with_every_request(
    stack: tuple[History, str, Path], bearer_proxy: BearerProxy, tmp_path: Path
) -> None:
    history, plain, _ = stack
    token = tmp_path / "token"
    token.write_text(f"  {TOKEN}\n")  # surrounding whitespace goes, as Prometheus' credentials_file
    args = ["--prometheus", bearer_proxy.url, "--format", "json", *range_of(history)]
    code, stdout, stderr = report(*args, "--bearer-token-file", str(token))
    assert code == 0, stderr
    assert json.loads(stdout) == plain_rows(history, plain)
    assert len(bearer_proxy.authorizations) > 5
    assert set(bearer_proxy.authorizations) == {f"Bearer {TOKEN}"}

    assert refusal("--prometheus", bearer_proxy.url).startswith(
        f"smlens: Prometheus at {bearer_proxy.url} asks for credentials (HTTP 401 Unauthorized)"
    )
    token.write_text("another-token\n")
    assert refusal("--prometheus", bearer_proxy.url, "--bearer-token-file", str(token)).startswith(
        f"smlens: Prometheus at {bearer_proxy.url} refused the credentials (HTTP 401 Unauthorized)"
    )
    missing = tmp_path / "absent"
    assert refusal("--prometheus", bearer_proxy.url, "--bearer-token-file", str(missing)) == (
        f"smlens: cannot read bearer token file {missing}: No such file or directory."
    )


# -- what is not a Prometheus with smlens' series ------------------------------------------------------


def test_an_unreachable_port() -> None:
    port = free_port()  # nothing listens there
    assert refusal("--prometheus", f"http://127.0.0.1:{port}") == (
        f"smlens: cannot reach Prometheus at http://127.0.0.1:{port}: connection refused."
    )


def test_a_plain_http_server_is_not_taken_for_prometheus(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text("<html><body>a web site</body></html>")
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert refusal("--prometheus", url) == (
            f"smlens: {url} does not answer as a Prometheus HTTP API: /api/v1/label/__name__/values gave "
            "HTTP 404 File not found (text/html), not Prometheus' JSON."
        )
    finally:
        server.shutdown()
        server.server_close()


NO_SERIES_ADVICE = (
    "enable smlens' accounting metric group (smlens serve --metrics default,accounting; Helm values "
    "metrics: [default, accounting])."
)


def test_a_prometheus_without_smlens_series(tmp_path: Path) -> None:
    with serve(tmp_path / "prometheus", tmp_path / "data") as url:
        line = refusal("--prometheus", url, "--since", "2h")
    assert line.startswith(f"smlens: Prometheus at {url} has no gpu_verdict_seconds_total series from ")
    assert line.endswith(NO_SERIES_ADVICE)


def test_a_range_without_the_series(stack: tuple[History, str, Path]) -> None:
    history, url, _ = stack
    line = refusal("--prometheus", url, "--since", "1d", "--until", str(history.start - 3 * 3600))
    assert line.startswith(f"smlens: Prometheus at {url} has no gpu_verdict_seconds_total series from ")
    assert line.endswith(NO_SERIES_ADVICE)


def test_a_range_older_than_the_retention(stack: tuple[History, str, Path]) -> None:
    url = stack[1]
    line = refusal("--prometheus", url, "--since", "30d")
    assert line.startswith("smlens: the range starts at ")
    assert line.endswith(
        f"before what Prometheus at {url} keeps (retention 10d): shorten --since, or move --until."
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--since", "7x"],
            "--since: '7x' must be a Prometheus duration back from --until (7d, 12h, 1h30m) or the start "
            "time (RFC 3339, or unix time).",
        ),
        (["--since", "0s"], "--since: '0s' must be a Prometheus duration back from --until"),
        (["--until", "yesterday"], "--until: 'yesterday' must be an RFC 3339 time such as"),
        (
            ["--since", "2025-01-02T00:00:00Z", "--until", "2025-01-01T00:00:00+00:00"],
            "--since must be before --until: the range would be empty.",
        ),
        (["--until", str(int(time.time()) + 86400)], "is in the future; the range must end by now."),
        (["--by", "pod"], "--by: 'pod' must be one of job, namespace, cluster."),
        (["--format", "xml"], "--format: 'xml' must be one of table, csv, json, markdown."),
        (["--basic-auth-user", "me"], "--basic-auth-user and --basic-auth-password-file go together"),
        (["--cert-file", "c.pem"], "--cert-file and --key-file go together; pass both."),
        (["--ca-file", "ca.pem"], "--ca-file applies to an https:// --prometheus URL only."),
        (["--insecure-skip-verify"], "--insecure-skip-verify applies to an https:// --prometheus URL only."),
        (
            ["--bearer-token-file", "t", "--basic-auth-user", "u", "--basic-auth-password-file", "p"],
            "--bearer-token-file and basic auth exclude each other; pass one of them.",
        ),
        (["--timeout", "0"], "--timeout: '0' must be from 1.0 to 3600.0."),
    ],
)
def test_bad_ranges_and_options_are_one_sentence(args: list[str], message: str) -> None:
    line = refusal("--prometheus", "http://127.0.0.1:9", *args)
    assert line.startswith("smlens: ") and message in line, line


def test_a_url_and_the_prometheus_option_are_needed() -> None:
    assert refusal() == (
        "smlens: smlens report needs --prometheus URL (or SMLENS_PROMETHEUS): the Prometheus to read."
    )
    assert "must be an http:// or https:// URL" in refusal("--prometheus", "prometheus:9090")


def test_a_query_over_prometheus_sample_limit(stack: tuple[History, str, Path], tmp_path: Path) -> None:
    copy_blocks(stack[2], tmp_path / "data")
    with serve(tmp_path / "prometheus", tmp_path / "data", flags=["--query.max-samples=100"]) as url:
        line = refusal("--prometheus", url, *range_of(stack[0]))
    assert line == (
        f"smlens: Prometheus at {url} refused a query over an hour of the accounting series as too large "
        "(query processing would load too many samples into memory in query execution): raise its "
        "--query.max-samples."
    )
