"""The HTTP server as users and attackers meet it: a real ``smlens serve`` process on loopback."""

from __future__ import annotations

import base64
import contextlib
import fcntl
import functools
import os
import resource
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import httpx
import pytest
import yaml
from bench.serving_attack import basic, busy_clients
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from starlette.routing import Mount

from conftest import REPO, free_port, require_tool, run_cli
from smlens.exposition.rendered import Publisher
from smlens.verdicts import thresholds
from smlens.web.app import create_app
from smlens.web.status.history import History
from tls_support import Issued, TestCA

AUTH = ("prometheus", "scrape-secret")
HASH = bcrypt.hashpw(AUTH[1].encode(), bcrypt.gensalt(4)).decode()
# prometheus_client's ProcessCollector's families, in its order; the counter's family is named without _total.
PROCESS_FAMILIES = [
    "process_virtual_memory_bytes",
    "process_resident_memory_bytes",
    "process_start_time_seconds",
    "process_cpu_seconds",
    "process_open_fds",
    "process_max_fds",
]


@dataclass
class Served:
    process: subprocess.Popen[bytes]
    port: int
    log: Path
    base: str

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def limit_open_files(count: int) -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (count, count))


class Launcher:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.processes: list[subprocess.Popen[bytes]] = []

    def __call__(
        self, *args: str, scheme: str = "http", ready: httpx.Client | None = None, nofile: int | None = None
    ) -> Served:
        """``nofile``: the server's limit of open files (soft and hard), as ``ulimit -n`` would set it."""
        port = free_port()
        log = self.directory / f"serve-{port}.log"
        with open(log, "wb") as out:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "smlens",
                    "serve",
                    "--backend",
                    "sim",
                    "--listen",
                    f"127.0.0.1:{port}",
                    *args,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(REPO / "exporter")},
                preexec_fn=None if nofile is None else functools.partial(limit_open_files, nofile),
            )
        self.processes.append(process)
        served = Served(process, port, log, f"{scheme}://127.0.0.1:{port}")
        client = ready or httpx.Client()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert process.poll() is None, served.log_text()
            try:
                if client.get(served.base + "/-/ready", timeout=1).status_code == 200:
                    return served
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(served.log_text())


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Launcher]:
    launcher = Launcher(tmp_path)
    yield launcher
    for process in launcher.processes:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture
def pki(tmp_path: Path) -> tuple[TestCA, Issued, Issued]:
    ca = TestCA(tmp_path)
    return ca, ca.issue("server", ["localhost", "127.0.0.1"]), ca.issue("client", ["prometheus"], client=True)


def web_config(directory: Path, content: dict[str, object]) -> Path:
    path = directory / "web.yml"
    path.write_text(yaml.safe_dump(content))
    return path


def tls_client(ca: TestCA, client: Issued | None = None, **kwargs: object) -> httpx.Client:
    context = ssl.create_default_context(cafile=str(ca.path))
    if client is not None:
        context.load_cert_chain(client.cert, client.key)
    return httpx.Client(verify=context, **kwargs)  # type: ignore[arg-type]


def test_tls_and_basic_auth_guard_every_endpoint_but_the_probes(
    serve: Launcher, pki: tuple[TestCA, Issued, Issued], tmp_path: Path
) -> None:
    ca, server, _ = pki
    config = web_config(
        tmp_path,
        {
            "tls_server_config": {"cert_file": str(server.cert), "key_file": str(server.key)},
            "basic_auth_users": {AUTH[0]: HASH},
            "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
        },
    )
    client = tls_client(ca)
    served = serve("--web-config-file", str(config), scheme="https", ready=client)
    for path in ("/metrics", "/api/v1/gpus", "/"):
        denied = client.get(served.base + path)
        assert denied.status_code == 401, path
        assert denied.headers["www-authenticate"] == "Basic"
        assert client.get(served.base + path, auth=("prometheus", "wrong")).status_code == 401
        allowed = client.get(served.base + path, auth=AUTH)
        assert allowed.status_code == 200, path
        assert allowed.headers["x-content-type-options"] == "nosniff"
    assert client.get(served.base + "/-/healthy").status_code == 200
    assert "serving 8 GPU(s) on https://" in served.log_text()
    # With TLS configured, plain HTTP gets no answer.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{served.port}/metrics", auth=AUTH, timeout=5)
    # A scrape after the first pays no bcrypt hash: many in a row stay fast (cost 4 here; the cache
    # itself is visible as equal latency whatever the cost).
    started = time.monotonic()
    for _ in range(20):
        assert client.get(served.base + "/-/ready", auth=AUTH).status_code == 200
    assert time.monotonic() - started < 10


def test_the_stored_hash_an_empty_password_and_the_user_name_are_refused(
    serve: Launcher, tmp_path: Path
) -> None:
    served = serve("--web-config-file", str(web_config(tmp_path, {"basic_auth_users": {AUTH[0]: HASH}})))
    url = served.base + "/metrics"
    assert httpx.get(url, auth=AUTH).status_code == 200
    # Fewer wrong passwords than the per-address burst of bcrypt checks: each one is really hashed.
    for password in (HASH, "", AUTH[0]):
        assert httpx.get(url, auth=(AUTH[0], password)).status_code == 401, repr(password)
    assert httpx.get(url, auth=AUTH).status_code == 200


def test_probes_behind_auth_with_the_flag(serve: Launcher, tmp_path: Path) -> None:
    config = web_config(tmp_path, {"basic_auth_users": {AUTH[0]: HASH}})
    port_probe = httpx.Client(auth=AUTH)
    served = serve("--web-config-file", str(config), "--web-protect-probes", ready=port_probe)
    assert httpx.get(served.base + "/-/ready").status_code == 401
    assert httpx.get(served.base + "/-/healthy").status_code == 401


def test_client_certificates_required_and_checked_against_allowed_sans(
    serve: Launcher, pki: tuple[TestCA, Issued, Issued], tmp_path: Path
) -> None:
    ca, server, client_cert = pki
    stranger = ca.issue("stranger", ["someone-else"], client=True)
    config = web_config(
        tmp_path,
        {
            "tls_server_config": {
                "cert_file": str(server.cert),
                "key_file": str(server.key),
                "client_auth_type": "RequireAndVerifyClientCert",
                "client_ca_file": str(ca.path),
                "client_allowed_sans": ["prometheus"],
            }
        },
    )
    good = tls_client(ca, client_cert)
    served = serve("--web-config-file", str(config), scheme="https", ready=good)
    assert good.get(served.base + "/metrics").status_code == 200
    with pytest.raises(httpx.HTTPError):
        tls_client(ca).get(served.base + "/metrics", timeout=5)
    with pytest.raises(httpx.HTTPError):
        tls_client(ca, stranger).get(served.base + "/metrics", timeout=5)


def presented_certificate(port: int, ca: TestCA) -> bytes:
    context = ssl.create_default_context(cafile=str(ca.path))
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        cert = tls.getpeercert(binary_form=True)
    assert cert is not None
    return cert


def test_rotated_certificate_is_served_without_restart_and_sighup_reloads(
    serve: Launcher, pki: tuple[TestCA, Issued, Issued], tmp_path: Path
) -> None:
    ca, server, _ = pki
    config = web_config(
        tmp_path, {"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"}}
    )
    served = serve("--web-config-file", str(config), scheme="https", ready=tls_client(ca))
    first = presented_certificate(served.port, ca)
    # cert-manager style rotation: new files under the same names.
    fresh = ca.issue("fresh", ["localhost", "127.0.0.1"])
    shutil.copy(fresh.cert, server.cert)
    shutil.copy(fresh.key, server.key)
    deadline = time.monotonic() + 10
    while presented_certificate(served.port, ca) == first:
        assert time.monotonic() < deadline, "the rotated certificate was never served"
        time.sleep(0.3)

    # A bad new file on SIGHUP: one log line, the old configuration stays in force.
    config.write_text(
        "tls_server_config: {cert_file: server.crt, key_file: server.key}\nbasic_auth_users: {a: b}\n"
    )
    served.process.send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert served.process.poll() is None
    refused = [line for line in served.log_text().splitlines() if "not reloaded" in line]
    assert len(refused) == 1, served.log_text()
    assert "basic_auth_users: the password of user 'a' is not a bcrypt hash" in refused[0]
    assert tls_client(ca).get(served.base + "/metrics").status_code == 200

    # A good new file on SIGHUP takes effect without a restart.
    config.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"},
                "basic_auth_users": {AUTH[0]: HASH},
            }
        )
    )
    served.process.send_signal(signal.SIGHUP)
    time.sleep(1.0)
    assert tls_client(ca).get(served.base + "/metrics").status_code == 401
    assert tls_client(ca).get(served.base + "/metrics", auth=AUTH).status_code == 200


def unread_bytes(sock: socket.socket) -> int:
    """Bytes that arrived on ``sock`` and wait to be read."""
    return int(struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0])


def test_sigterm_stops_within_5s_while_a_client_pipelines_and_never_reads(serve: Launcher) -> None:
    served = serve()
    with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        for _ in range(3000):
            try:
                sock.send(request)
            except BlockingIOError:
                break
        wait_for(
            lambda: unread_bytes(sock) > 0, "the first answers arrived"
        )  # then the server's writes stall
        started = time.monotonic()
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=10) == 0
        assert time.monotonic() - started < 5
    log_text = served.log_text()
    assert "stopped; data sources closed" in log_text
    assert "Traceback" not in log_text and "CancelledError" not in log_text, log_text


def test_sigterm_while_requests_wait_on_bcrypt_logs_no_traceback(serve: Launcher, tmp_path: Path) -> None:
    slow = bcrypt.hashpw(b"right", bcrypt.gensalt(12)).decode()
    served = serve("--web-config-file", str(web_config(tmp_path, {"basic_auth_users": {"prometheus": slow}})))
    wrong = base64.b64encode(b"prometheus:wrong")
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Basic " + wrong + b"\r\n\r\n"
    clients = [socket.create_connection(("127.0.0.1", served.port), timeout=5) for _ in range(40)]
    try:
        for sock in clients:
            sock.sendall(request * 20)
        time.sleep(1.0)
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=10) == 0
    finally:
        for sock in clients:
            sock.close()
    log_text = served.log_text()
    assert "Traceback" not in log_text and "CancelledError" not in log_text, log_text
    assert sum("cancelled" in line for line in log_text.splitlines()) <= 1, log_text
    assert "stopped; data sources closed" in log_text


def read_until_closed(sock: socket.socket, timeout: float) -> float:
    """Seconds until the server closed the connection (raises if it did not within ``timeout``)."""
    started = time.monotonic()
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - started


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.05)


def metric(served: Served, sample: str, client: httpx.Client | None = None) -> float:
    """One sample's value on /metrics, e.g. ``smlens_http_connections_closed_total{reason="evicted"}``."""
    text = (client or httpx).get(served.base + "/metrics", timeout=5).text
    return float(next(line for line in text.splitlines() if line.startswith(sample + " ")).split()[-1])


def closed_after(served: Served, reason: str, client: httpx.Client | None = None) -> float:
    return metric(served, f'smlens_http_connections_closed_total{{reason="{reason}"}}', client)


def exchange(port: int, data: bytes, timeout: float = 5) -> bytes:
    """All the server sends back to ``data`` on one connection, until it closes that connection."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        deadline = time.monotonic() + timeout
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(65536):
                received += chunk
                assert time.monotonic() < deadline, "the connection was not closed"
    return received


def new_lines(served: Served, before: int) -> list[str]:
    return served.log_text().splitlines()[before:]


def test_header_timeout_closes_silent_and_trickling_connections(serve: Launcher) -> None:
    served = serve("--web-header-timeout", "1", "--web-idle-timeout", "3")
    with socket.create_connection(("127.0.0.1", served.port)) as silent:
        assert read_until_closed(silent, timeout=5) < 3
    with socket.create_connection(("127.0.0.1", served.port)) as trickler:
        trickler.sendall(b"GET /metrics HTTP/1.1\r\n")
        for _ in range(4):  # a byte every 0.4 s never completes the headers
            time.sleep(0.4)
            try:
                trickler.sendall(b"X")
            except OSError:
                break
        assert read_until_closed(trickler, timeout=5) < 3
    with socket.create_connection(("127.0.0.1", served.port)) as idle:
        idle.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.2)
        assert b"200 OK" in idle.recv(4096)
        assert 2 < read_until_closed(idle, timeout=6) < 5  # the keep-alive idle timeout
    with socket.create_connection(("127.0.0.1", served.port)) as second:  # a served client, then a trickle
        second.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.2)
        assert b"200 OK" in second.recv(4096)
        second.sendall(b"GET /metrics HTTP/1.1\r\n")
        assert read_until_closed(second, timeout=6) < 2  # the header timeout again, not the idle one
    metrics = httpx.get(served.base + "/metrics").text
    assert 'smlens_http_connections_closed_total{reason="header_timeout"} 3.0' in metrics


def test_fresh_client_is_served_at_once_over_the_connection_cap(serve: Launcher) -> None:
    served = serve("--web-max-connections", "8")
    addresses = [f"127.0.0.{n}" for n in range(2, 12)]  # 5 each: over the cap of 8, and the share of 4
    silent = [socket.create_connection(("127.0.0.1", served.port), 5, (a, 0)) for a in addresses * 5]
    try:
        time.sleep(0.5)
        started = time.monotonic()
        assert httpx.get(served.base + "/metrics", timeout=5).status_code == 200
        assert time.monotonic() - started < 2
        metrics = httpx.get(served.base + "/metrics").text
    finally:
        for sock in silent:
            sock.close()
    evicted = next(line for line in metrics.splitlines() if 'reason="evicted"' in line)
    assert float(evicted.split()[-1]) >= 30
    assert "smlens_http_open_connections" in metrics


def test_busy_pipelining_clients_from_other_addresses_do_not_lock_prometheus_out(
    serve: Launcher, tmp_path: Path
) -> None:
    hashed = bcrypt.hashpw(AUTH[1].encode(), bcrypt.gensalt(10)).decode()
    served = serve(
        "--web-max-connections",
        "16",
        "--web-config-file",
        str(web_config(tmp_path, {"basic_auth_users": {AUTH[0]: hashed}})),
    )
    assert httpx.get(served.base + "/metrics", auth=AUTH).status_code == 200
    wrong = f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: {basic(AUTH[0], 'wrong')}\r\n\r\n"
    healthy = b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n"
    threads = [
        *busy_clients(served.port, ["127.0.0.2"], 20, lambda _: wrong.encode(), 6.0),
        *busy_clients(served.port, ["127.0.0.3"], 20, lambda _: healthy, 6.0),
    ]
    time.sleep(1.0)
    statuses = []
    for _ in range(10):
        try:
            statuses.append(httpx.get(served.base + "/metrics", auth=AUTH, timeout=3).status_code)
        except httpx.HTTPError as exc:
            statuses.append(type(exc).__name__)
        time.sleep(0.3)
    for thread in threads:
        thread.join()
    assert statuses == [200] * 10
    metrics = httpx.get(served.base + "/metrics", auth=AUTH).text
    assert 'smlens_http_connections_closed_total{reason="per_address"}' in metrics


def raise_own_open_files(count: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < count:
        pytest.fail(f"this test opens {count} sockets; the hard limit of open files is {hard}")
    if soft != resource.RLIM_INFINITY and soft < count:
        resource.setrlimit(resource.RLIMIT_NOFILE, (count, hard))


@pytest.mark.parametrize("max_connections", [None, 2000], ids=["default_cap", "cap_over_the_fd_limit"])
def test_1100_silent_connections_under_ulimit_1024(serve: Launcher, max_connections: int | None) -> None:
    """With the default cap the server never gets near its limit of open files; with a cap over it, the
    files run out (EMFILE): counted, logged once, and a fresh client is still answered at once."""
    raise_own_open_files(1400)
    args = () if max_connections is None else ("--web-max-connections", str(max_connections))
    served = serve(*args, nofile=1024)
    before = len(served.log_text().splitlines())
    silent: list[socket.socket] = []
    try:
        for n in range(1100):  # from 11 addresses, 100 each: within the share of a cap of 2000
            with contextlib.suppress(OSError):  # a connect that timed out: the backlog was full
                silent.append(
                    socket.create_connection(("127.0.0.1", served.port), 3, (f"127.0.0.{2 + n % 11}", 0))
                )
        assert len(silent) >= 1000
        for _ in range(5):
            started = time.monotonic()
            assert httpx.get(served.base + "/metrics", timeout=10).status_code == 200
            assert time.monotonic() - started < 3
        open_fds = metric(served, "process_open_fds")
        open_connections = metric(served, "smlens_http_open_connections")
        accept_errors = metric(served, "smlens_http_accept_errors_total")
    finally:
        for sock in silent:
            sock.close()
    assert served.process.poll() is None
    if max_connections is None:
        assert open_connections <= 64 and open_fds < 200 and accept_errors == 0
    else:
        assert accept_errors > 0
    lines = new_lines(served, before)
    assert len(lines) <= 2, lines
    assert not any("Traceback" in line for line in lines), lines


def test_slowloris_connections_are_closed_by_the_header_timeout(serve: Launcher) -> None:
    served = serve("--web-header-timeout", "1")
    tricklers = [
        socket.create_connection(("127.0.0.1", served.port), 5, (f"127.0.0.{2 + n % 4}", 0))
        for n in range(16)
    ]
    try:
        for sock in tricklers:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        open_ = set(tricklers)
        while open_ and time.monotonic() - started < 5:  # a header line every 0.2 s never ends the head
            for sock in list(open_):
                try:
                    sock.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    open_.discard(sock)
            time.sleep(0.2)
        assert not open_, f"{len(open_)} trickling connection(s) still open after 5 s"
        assert time.monotonic() - started < 3
    finally:
        for sock in tricklers:
            sock.close()
    assert closed_after(served, "header_timeout") == 16
    assert httpx.get(served.base + "/metrics").status_code == 200


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
    ],
)
def test_content_length_with_transfer_encoding_is_refused_and_nothing_smuggled(
    serve: Launcher, framing: bytes
) -> None:
    served = serve()
    smuggled = b"GET /api/v1/gpus HTTP/1.1\r\nHost: x\r\n\r\n"
    for method in (b"POST", b"GET"):
        head = method + b" /metrics HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n"
        answer = exchange(served.port, head + b"0\r\n\r\n" + smuggled)
        assert answer.startswith(b"HTTP/1.1 400 "), answer
        assert answer.count(b"HTTP/1.1 ") == 1, answer  # the smuggled request was never answered
        assert b"connection: close" in answer.lower()
        assert b"gpus" not in answer
    assert metric(served, "smlens_http_malformed_requests_total") == 2


def test_a_head_over_16_kib_is_refused_with_431(serve: Launcher) -> None:
    served = serve()
    request = b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n"
    # Under the limit: answered.
    assert exchange(
        served.port, request + b"X-Pad: " + b"a" * 12_000 + b"\r\nConnection: close\r\n\r\n"
    ).startswith(b"HTTP/1.1 200 ")
    # Over it, in one write (a complete head in one read) and as a head that never ends.
    big = request + b"".join(b"X-Pad-%d: %s\r\n" % (n, b"a" * 1000) for n in range(20))
    for data in (big + b"\r\n", big):
        answer = exchange(served.port, data)
        assert answer.startswith(b"HTTP/1.1 431 "), answer[:100]
        assert answer.count(b"HTTP/1.1 ") == 1
    assert metric(served, "smlens_http_malformed_requests_total") == 2


MALFORMED = [
    b"\x16\x03\x01 not http\r\n\r\n",
    b"NOT HTTP AT ALL\r\n\r\n",
    b"GET /\xff HTTP/1.1\r\nHost: x\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n",
    b"GET / HTTP/1.1\r\n\r\n",  # no Host
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: many\r\n\r\n",
    b"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"\x00\x01\x02\x03\r\n\r\n",
]


def test_malformed_requests_are_counted_not_logged(serve: Launcher) -> None:
    served = serve()
    lines_before = len(served.log_text().splitlines())
    for _ in range(10):
        for data in MALFORMED:
            answer = exchange(served.port, data)
            assert answer.startswith(b"HTTP/1.1 400 "), (data, answer)
    # Bytes after a request that ends the connection are not read as a next request.
    for request in (
        b"GET /-/healthy HTTP/1.0\r\n\r\n",
        b"GET /-/healthy HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ):
        with socket.create_connection(("127.0.0.1", served.port), timeout=5) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # two segments, most often two reads
            sock.sendall(request)
            with contextlib.suppress(OSError):
                sock.sendall(b"garbage\r\n\r\n")
            answer = sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200 "), answer
    assert metric(served, "smlens_http_malformed_requests_total") == 10 * len(MALFORMED)
    assert served.log_text().splitlines()[lines_before:] == []


def test_silent_tls_connections_are_bounded(
    serve: Launcher, pki: tuple[TestCA, Issued, Issued], tmp_path: Path
) -> None:
    ca, server, _ = pki
    config = web_config(
        tmp_path, {"tls_server_config": {"cert_file": str(server.cert), "key_file": str(server.key)}}
    )
    client = tls_client(ca)
    served = serve(
        "--web-config-file",
        str(config),
        "--web-max-connections",
        "8",
        "--web-header-timeout",
        "1",
        scheme="https",
        ready=client,
    )
    before = len(served.log_text().splitlines())
    silent = [
        socket.create_connection(("127.0.0.1", served.port), 5, (f"127.0.0.{2 + n % 10}", 0))
        for n in range(100)
    ]
    try:
        started = time.monotonic()
        with tls_client(ca) as fresh:  # a new connection, not one the pool kept
            assert fresh.get(served.base + "/metrics", timeout=5).status_code == 200
        assert time.monotonic() - started < 2
        started = time.monotonic()
        for sock in silent:  # every one is closed: evicted, or at the end of the handshake's time
            read_until_closed(sock, timeout=5)
        assert time.monotonic() - started < 3
    finally:
        for sock in silent:
            sock.close()
    fresh = tls_client(ca)
    assert closed_after(served, "per_address", fresh) + closed_after(served, "evicted", fresh) >= 85
    assert closed_after(served, "tls_handshake", fresh) >= 1
    assert metric(served, "smlens_http_open_connections", fresh) <= 2
    assert new_lines(served, before) == []


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
def test_an_idle_keep_alive_client_does_not_delay_exit(
    serve: Launcher, pki: tuple[TestCA, Issued, Issued], tmp_path: Path, tls: bool
) -> None:
    ca, server, _ = pki
    if tls:
        config = web_config(
            tmp_path, {"tls_server_config": {"cert_file": str(server.cert), "key_file": str(server.key)}}
        )
        served = serve("--web-config-file", str(config), scheme="https", ready=tls_client(ca))
    else:
        served = serve()
    raw = socket.create_connection(("127.0.0.1", served.port), timeout=5)
    context = ssl.create_default_context(cafile=str(ca.path))
    with context.wrap_socket(raw, server_hostname="localhost") if tls else raw as sock:
        sock.sendall(b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while not answer.endswith(b"\r\n\r\nOK\n"):  # the whole answer: the connection is idle now
            answer += sock.recv(4096)
        assert answer.startswith(b"HTTP/1.1 200 ")
        started = time.monotonic()
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(timeout=10) == 0
        elapsed = time.monotonic() - started
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(4096) == b""  # closed by the server (with a close_notify under TLS)
    assert elapsed < 1.5, elapsed  # well inside the grace period that busy connections get
    log_text = served.log_text()
    assert "stopped; data sources closed" in log_text and "Traceback" not in log_text, log_text


def test_head_works_on_every_get_endpoint(serve: Launcher) -> None:
    served = serve()
    limits = thresholds.load()
    app = create_app(Publisher(), limits, lambda: True, History(limits))  # the routes `serve` has
    paths = {path for path, ops in app.openapi()["paths"].items() if "get" in ops}
    # The status page's assets are a mounted StaticFiles, which the OpenAPI document does not list.
    paths |= {f"{route.path}/status.js" for route in app.routes if isinstance(route, Mount)}
    assert {"/", "/metrics", "/api/v1/history", "/static/status.js"} <= paths
    for path in sorted(paths):
        get = httpx.get(served.base + path)
        head = httpx.head(served.base + path)
        assert (head.status_code, head.content) == (get.status_code, b""), path
        assert head.headers["content-type"] == get.headers["content-type"]
    assert httpx.head(served.base + "/nowhere").status_code == 404


def test_process_metrics_are_exported_and_both_formats_are_valid(serve: Launcher) -> None:
    """promtool and prometheus_client's strict OpenMetrics parser judge the bodies, and the process_*
    values are the serving process' own."""
    before = time.time()
    served = serve()
    pid = served.process.pid
    text = httpx.get(served.base + "/metrics").content
    checked = subprocess.run(
        [require_tool("promtool"), "check", "metrics"], input=text, capture_output=True, timeout=30
    )
    assert (checked.returncode, checked.stdout, checked.stderr) == (0, b"", b"")
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    (vmrss,) = (line for line in status if line.startswith("VmRSS:"))
    asks = {"Accept": "application/openmetrics-text"}
    deadline = time.monotonic() + 10  # the first scrape asking for it gets text; the next tick renders it
    while (
        not (reply := httpx.get(served.base + "/metrics", headers=asks))
        .headers["content-type"]
        .startswith("application/openmetrics-text")
        and time.monotonic() < deadline
    ):
        time.sleep(0.1)
    openmetrics = reply.text
    assert openmetrics.count("# EOF") == 1 and openmetrics.endswith("# EOF\n")
    families = {family.name: family for family in parse_openmetrics(openmetrics)}
    for parsed in (families, {family.name: family for family in parse_text(text.decode())}):
        process = {
            name: family.samples[0].value for name, family in parsed.items() if name.startswith("process_")
        }
        assert list(process) == PROCESS_FAMILIES
        rss = int(vmrss.split()[1]) * 1024
        assert abs(process["process_resident_memory_bytes"] - rss) <= 0.1 * rss
        assert process["process_virtual_memory_bytes"] >= process["process_resident_memory_bytes"]
        # /proc/stat's boot time is in whole seconds: the start time may read up to 1 s early.
        assert before - 1 <= process["process_start_time_seconds"] <= time.time()
        assert 0 < process["process_cpu_seconds"] <= (time.time() - before) * (os.cpu_count() or 1)
        assert 3 <= process["process_open_fds"] <= process["process_max_fds"]
    assert families["process_cpu_seconds"].type == "counter"


def test_port_in_use_gets_one_sentence_before_anything_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("serve", "--backend", "sim", "--listen", f"127.0.0.1:{port}")
    assert result.returncode == 1
    assert result.stderr == f"smlens: cannot listen on 127.0.0.1:{port}: Address already in use.\n"


def test_unresolvable_host_and_bad_web_config_get_one_sentence(tmp_path: Path) -> None:
    result = run_cli("serve", "--backend", "sim", "--listen", "no-such-host.invalid:10132")
    assert result.returncode == 1
    assert result.stderr.startswith("smlens: cannot listen on no-such-host.invalid:10132: the host does not")
    assert result.stderr.count("\n") == 1
    config = web_config(
        tmp_path, {"tls_server_config": {"cert_file": "absent.crt", "key_file": "absent.key"}}
    )
    port = free_port()
    result = run_cli(
        "serve", "--backend", "sim", "--listen", f"127.0.0.1:{port}", "--web-config-file", str(config)
    )
    assert result.returncode == 1
    assert "tls_server_config.cert_file: cannot read" in result.stderr
    assert result.stderr.count("\n") == 1


def test_basic_credentials_parsing() -> None:
    from smlens.web.guard import basic_credentials

    token = base64.b64encode(b"user:pa:ss")
    assert basic_credentials(b"Basic " + token) == (b"user", b"pa:ss")
    assert basic_credentials(b"Bearer " + token) is None
    assert basic_credentials(b"Basic !!!") is None
    assert basic_credentials(b"Basic " + base64.b64encode(b"nocolon")) is None


def test_accept_errors_are_counted_and_logged_at_most_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    import asyncio
    import errno

    from smlens.web.connections import Limits
    from smlens.web.server import WebServer

    now = [0.0]
    with socket.socket() as sock:
        server = WebServer(sock, Limits(), clock=lambda: now[0])
        loop = asyncio.new_event_loop()
        try:
            error = OSError(errno.EMFILE, "Too many open files")
            for step in range(500):  # asyncio retries accept() once a second after such an error
                now[0] = step * 0.5
                server.handle_loop_error(
                    loop, {"message": "socket.accept() out of system resource", "exception": error}
                )
        finally:
            loop.close()
    assert server.stats.accept_errors == 500
    logged = [r for r in caplog.records if "cannot accept connections" in r.getMessage()]
    assert len(logged) == 5  # at 0, 60, 120, 180 and 240 s
    assert "(120 time(s) since the last report" in logged[1].getMessage()


def encrypted_copy(key: Path, to: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    private = serialization.load_pem_private_key(key.read_bytes(), password=None)
    to.write_bytes(
        private.private_bytes(  # type: ignore[union-attr]
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"a passphrase"),
        )
    )


def test_an_encrypted_key_is_one_sentence_at_start_up_and_never_a_prompt(
    pki: tuple[TestCA, Issued, Issued], tmp_path: Path
) -> None:
    _, server, _ = pki
    encrypted_copy(server.key, tmp_path / "server.key")
    config = web_config(
        tmp_path, {"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"}}
    )
    done = run_cli("serve", "--backend", "sim", "--listen", "127.0.0.1:0", "--web-config-file", str(config))
    assert done.returncode == 1
    assert "the key is encrypted with a passphrase" in done.stderr and "Traceback" not in done.stderr
    assert "PEM pass phrase" not in done.stderr + done.stdout  # OpenSSL's prompt


def test_a_key_swapped_for_an_encrypted_one_is_refused_on_reload_and_serving_goes_on(
    serve: Launcher, pki: tuple[TestCA, Issued, Issued], tmp_path: Path
) -> None:
    ca, server, _ = pki
    config = web_config(
        tmp_path, {"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"}}
    )
    served = serve("--web-config-file", str(config), scheme="https", ready=tls_client(ca))
    encrypted_copy(server.key, server.key)
    served.process.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "the key is encrypted" not in served.log_text():
        assert time.monotonic() < deadline, served.log_text()
        time.sleep(0.1)
    assert tls_client(ca).get(served.base + "/-/healthy", timeout=5).status_code == 200
    assert "PEM pass phrase" not in served.log_text()
