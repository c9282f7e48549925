"""Benchmark: the exporter's HTTP server under hostile clients, on loopback, with bounded loops.

Starts the real exporter (``python -m smlens serve --backend sim``) from one or two source trees (this
checkout, and optionally a baseline such as an older commit's) and prints, per tree:

- silent: the server runs under ``ulimit -n 1024``; 1,100 connections from 11 addresses that send nothing
  are held for ``--hold`` seconds; a fresh client's slowest wait for /metrics over that time (target < 3 s),
  the log lines the server wrote meanwhile (target: a few), its accept errors and open descriptors. Twice:
  with the default cap of connections, and with a cap of 2000, over the descriptor limit (EMFILE);
- slowloris: ``--slowloris`` connections that trickle a header line every 0.2 s (``--web-header-timeout
  2``): seconds until the last one is closed (target: about the header timeout) and a fresh client's wait;
- half-open: RSS before 8,000 connections that send a partial request and trickle a byte now and then,
  at their peak, and after they close (target: back within 10 MiB of the start);
- smuggle: a request with both Content-Length and Transfer-Encoding followed by a second request: the
  status (target: 400), the answers (target: 1) and whether the server closed the connection;
- big_head: a request head over 16 KiB, in one write and as a head that never ends: the status (431);
- malformed: log lines written for 2,000 malformed requests (one connection each), and the count of them
  on /metrics (target: 0 lines, 2,000 counted);
- tls_silent: ``--tls-silent`` connections that never start their TLS handshake (``--web-max-connections
  8 --web-header-timeout 1``): a fresh TLS client's wait for /metrics, seconds until the last silent one
  is closed, and the server's open connections after (target: a second or two, bounded);
- shutdown: seconds from SIGTERM to exit while a client pipelines requests and never reads (target < 5);
- idle_shutdown: seconds from SIGTERM to exit while an idle keep-alive client holds its connection, plain
  and TLS (target: well under the 2 s grace period busy connections get);
- unread body: a POST /metrics announcing 100 GB, which the exporter answers (405) without reading, the client
  streaming on for ``--unread-seconds``: MiB it got to send after the answer and the server's CPU seconds
  meanwhile (target: the connection ends, a few MiB of socket buffers at most);
- busy: ``--busy`` connections that keep pipelining, for ``--busy-seconds``, while a fresh client on
  127.0.0.1 scrapes /metrics every 0.3 s; the share of its scrapes answered 200 (target: 1.00).
  Variants: /-/healthy from one address (127.0.0.2, no web config); a wrong password from one address;
  changing wrong passwords spread over 127.0.0.2-127.0.0.8 (basic auth with a cost-10 bcrypt hash).

    python3 bench/serving_attack.py [--baseline-tree DIR] [--hold 20] [--half-open 8000] [--busy 70]
        [--unread-seconds 5] [--only SCENARIO]

A baseline tree is made with e.g. ``git archive <commit> exporter | tar -x -C /tmp/before``, then
``--baseline-tree /tmp/before/exporter``. The TLS scenarios make a throw-away CA with tests/tls_support.py
(the ``cryptography`` package of the test extra).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import os
import re
import resource
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


@dataclass
class Exporter:
    tree: Path
    nofile: int | None = None
    args: tuple[str, ...] = ()
    port: int = field(default_factory=free_port)
    tls: ssl.SSLContext | None = None  # the client's context when the server serves TLS
    proc: subprocess.Popen[bytes] | None = None
    lines: int = 0
    log_bytes: int = 0

    def __enter__(self) -> Exporter:
        limit = self.nofile

        def lower_fd_limit() -> None:
            if limit is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "smlens",
                "serve",
                "--backend",
                "sim",
                "--listen",
                f"127.0.0.1:{self.port}",
                *self.args,
            ],
            env=dict(os.environ, PYTHONPATH=str(self.tree), SMLENS_LOG_LEVEL="info"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=lower_fd_limit,
        )
        threading.Thread(target=self._count_log, daemon=True).start()
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.get("/-/ready", timeout=1)[0] == 200:
                return self
            time.sleep(0.2)
        raise RuntimeError(f"exporter from {self.tree} did not become ready")

    def _count_log(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for line in self.proc.stderr:  # counted, never stored: an attacked server may write hundreds of MB
            self.lines += 1
            self.log_bytes += len(line)

    def get(self, path: str, timeout: float, headers: dict[str, str] | None = None) -> tuple[int, float]:
        status, seconds, _ = self.fetch(path, timeout, headers)
        return status, seconds

    def fetch(
        self, path: str, timeout: float, headers: dict[str, str] | None = None
    ) -> tuple[int, float, bytes]:
        """(status, seconds, body) on a new connection; status 0 when there was no answer."""
        started = time.monotonic()
        conn: http.client.HTTPConnection
        if self.tls is None:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        else:
            conn = http.client.HTTPSConnection("127.0.0.1", self.port, timeout=timeout, context=self.tls)
        try:
            conn.request("GET", path, headers=headers or {})
            response = conn.getresponse()
            body = response.read()
            return response.status, time.monotonic() - started, body
        except (OSError, http.client.HTTPException):
            return 0, time.monotonic() - started, b""
        finally:
            conn.close()

    def metric(self, sample: str) -> float:
        """A sample's value on /metrics (nan when there was no answer or no such sample)."""
        status, _, body = self.fetch("/metrics", timeout=10)
        found = re.search(rb"^" + re.escape(sample.encode()) + rb" (\S+)$", body, re.MULTILINE)
        return float(found.group(1)) if status == 200 and found else float("nan")

    def closed(self, reason: str) -> float:
        return self.metric(f'smlens_http_connections_closed_total{{reason="{reason}"}}')

    def stop(self) -> float:
        """Seconds from SIGTERM to exit (killed after 20 s)."""
        assert self.proc is not None
        started = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return float("inf")
        return time.monotonic() - started

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def open_silent(port: int, count: int, addresses: int = 11) -> list[socket.socket]:
    """Connections that send nothing, from ``addresses`` source addresses in turn; each connect waits for
    the handshake (3 s at most: a full backlog drops it), so that they all reach the server."""
    socks = []
    for n in range(count):
        with contextlib.suppress(OSError):
            socks.append(
                socket.create_connection(("127.0.0.1", port), 3, (f"127.0.0.{2 + n % addresses}", 0))
            )
    return socks


def close_all(socks: list[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def silent_attack(tree: Path, hold: float, max_connections: int | None) -> dict[str, float]:
    args = () if max_connections is None else ("--web-max-connections", str(max_connections))
    with Exporter(tree, nofile=1024, args=args) as exporter:
        assert exporter.proc is not None
        before, before_bytes = exporter.lines, exporter.log_bytes
        socks = open_silent(exporter.port, 1100)
        slowest, statuses, fds = 0.0, set(), 0
        until = time.monotonic() + hold
        while time.monotonic() < until:
            fds = max(fds, len(os.listdir(f"/proc/{exporter.proc.pid}/fd")))
            status, wait = exporter.get("/metrics", timeout=15.0)
            statuses.add(status)
            slowest = max(slowest, wait)
            time.sleep(0.5)
        accept_errors = exporter.metric("smlens_http_accept_errors_total")
        close_all(socks)
        time.sleep(1.0)
        result = {
            "connected": float(len(socks)),
            "fresh_client_slowest_s": slowest,
            "fresh_client_all_200": float(statuses == {200}),
            "server_fds_peak": float(fds),
            "accept_errors": accept_errors,
            "log_lines": float(exporter.lines - before),
            "log_mib": (exporter.log_bytes - before_bytes) / MIB,
        }
        result["sigterm_exit_s"] = exporter.stop()
        return result


def slowloris(tree: Path, count: int) -> dict[str, float]:
    with Exporter(tree, args=("--web-header-timeout", "2")) as exporter:
        socks = open_silent(exporter.port, count, addresses=8)
        started = time.monotonic()
        open_ = set(socks)
        last_closed = 0.0
        for sock in socks:
            with contextlib.suppress(OSError):
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        _, wait = exporter.get("/metrics", timeout=10)
        while open_ and time.monotonic() - started < 15:  # a header line every 0.2 s never ends the head
            for sock in list(open_):
                try:
                    sock.sendall(b"X-Slow: 1\r\n")
                except OSError:
                    open_.discard(sock)
                    last_closed = time.monotonic() - started
            time.sleep(0.2)
        result = {
            "connected": float(len(socks)),
            "still_open_after_15s": float(len(open_)),
            "last_closed_s": last_closed,
            "fresh_client_wait_s": wait,
            "closed_header_timeout": exporter.closed("header_timeout"),
        }
        close_all(socks)
        exporter.stop()
        return result


def half_open_attack(tree: Path, count: int, trickle_rounds: int) -> dict[str, float]:
    with Exporter(tree) as exporter:
        assert exporter.proc is not None
        for _ in range(20):  # warm up: a few scrapes so that the steady state is in the baseline
            exporter.get("/metrics", timeout=5)
        time.sleep(1.0)
        start = rss_bytes(exporter.proc.pid)
        socks = []
        for _ in range(count):
            sock = socket.socket()
            sock.settimeout(2.0)
            try:
                sock.connect(("127.0.0.1", exporter.port))
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            except OSError:
                pass
            socks.append(sock)
        peak = rss_bytes(exporter.proc.pid)
        for _ in range(trickle_rounds):
            for sock in socks:
                with contextlib.suppress(OSError):
                    sock.send(b"X")
            time.sleep(1.0)
            peak = max(peak, rss_bytes(exporter.proc.pid))
        fds_held = len(os.listdir(f"/proc/{exporter.proc.pid}/fd"))
        close_all(socks)
        time.sleep(3.0)
        after = rss_bytes(exporter.proc.pid)
        exporter.stop()
        return {
            "rss_start_mib": start / MIB,
            "rss_peak_mib": peak / MIB,
            "rss_after_mib": after / MIB,
            "rss_after_minus_start_mib": (after - start) / MIB,
            "server_fds_while_held": float(fds_held),
        }


def exchange(port: int, data: bytes, timeout: float = 5.0) -> tuple[bytes, bool]:
    """What the server answers to ``data`` on one connection, and whether it closed the connection."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:
            pass
        except OSError:  # a timeout: still open
            return received, False
    return received, True


def status_of(answer: bytes) -> float:
    parts = answer.split(b" ", 2)
    return float(parts[1]) if answer.startswith(b"HTTP/") and len(parts) > 1 else 0.0


def smuggle(tree: Path) -> dict[str, float]:
    with Exporter(tree) as exporter:
        second = b"GET /api/v1/gpus HTTP/1.1\r\nHost: x\r\n\r\n"
        head = b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
        answer, closed = exchange(exporter.port, head + b"0\r\n\r\n" + second)
        result = {
            "status": status_of(answer),
            "answers": float(answer.count(b"HTTP/1.1 ")),
            "closed": float(closed),
            "malformed_counted": exporter.metric("smlens_http_malformed_requests_total"),
        }
        exporter.stop()
        return result


def big_head(tree: Path) -> dict[str, float]:
    with Exporter(tree) as exporter:
        head = b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n" + b"".join(
            b"X-Pad-%d: %s\r\n" % (n, b"a" * 1000) for n in range(20)
        )
        whole, whole_closed = exchange(exporter.port, head + b"\r\n")
        endless, endless_closed = exchange(exporter.port, head)
        result = {
            "one_write_status": status_of(whole),
            "one_write_closed": float(whole_closed),
            "endless_status": status_of(endless),
            "endless_closed": float(endless_closed),
        }
        exporter.stop()
        return result


def malformed_flood(tree: Path, count: int) -> dict[str, float]:
    with Exporter(tree) as exporter:
        time.sleep(0.5)
        before = exporter.lines
        for _ in range(count):
            with socket.create_connection(("127.0.0.1", exporter.port), timeout=5) as sock:
                sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
                with contextlib.suppress(OSError):
                    sock.recv(4096)
        time.sleep(1.0)
        counted = exporter.metric("smlens_http_malformed_requests_total")
        return {"log_lines": float(exporter.lines - before), "counted": counted}


@contextlib.contextmanager
def tls_config(directory: Path) -> Iterator[tuple[Path, ssl.SSLContext]]:
    """A web config serving TLS with a throw-away CA's certificate, and a client context trusting it."""
    sys.path.insert(0, str(REPO / "tests"))
    try:
        from tls_support import TestCA  # the test extra's cryptography
    finally:
        sys.path.remove(str(REPO / "tests"))
    ca = TestCA(directory)
    server = ca.issue("server", ["localhost", "127.0.0.1"])
    web = directory / "web.yml"
    web.write_text(f"tls_server_config:\n  cert_file: '{server.cert}'\n  key_file: '{server.key}'\n")
    yield web, ssl.create_default_context(cafile=str(ca.path))


def tls_silent(tree: Path, count: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory, tls_config(Path(directory)) as (web, context):
        args = ("--web-config-file", str(web), "--web-max-connections", "8", "--web-header-timeout", "1")
        with Exporter(tree, args=args, tls=context) as exporter:
            before = exporter.lines
            socks = open_silent(exporter.port, count, addresses=10)
            status, wait = exporter.get("/metrics", timeout=10)
            started = time.monotonic()
            closed = 0
            for sock in socks:  # every one should end: dropped for the cap, or at the handshake's deadline
                sock.settimeout(max(0.1, 10 - (time.monotonic() - started)))
                try:
                    while sock.recv(4096):
                        pass
                except ConnectionResetError:
                    pass
                except TimeoutError:
                    continue
                closed += 1
            result = {
                "connected": float(len(socks)),
                "fresh_client_status": float(status),
                "fresh_client_wait_s": wait,
                "closed_by_server": float(closed),
                "all_closed_after_s": time.monotonic() - started,
                "dropped_for_the_cap": exporter.closed("per_address") + exporter.closed("evicted"),
                "closed_tls_handshake": exporter.closed("tls_handshake"),
                "open_connections_after": exporter.metric("smlens_http_open_connections"),
                "log_lines": float(exporter.lines - before),
            }
            close_all(socks)
            exporter.stop()
            return result


def idle_shutdown(tree: Path) -> dict[str, float]:
    """An idle keep-alive client (a scrape answered, its connection kept) at SIGTERM, plain and TLS."""
    results = {}
    with tempfile.TemporaryDirectory() as directory, tls_config(Path(directory)) as (web, context):
        variants: tuple[tuple[str, tuple[str, ...], ssl.SSLContext | None], ...] = (
            ("plain", (), None),
            ("tls", ("--web-config-file", str(web)), context),
        )
        for name, args, tls in variants:
            with Exporter(tree, args=args, tls=tls) as exporter:
                conn: http.client.HTTPConnection
                if tls is None:
                    conn = http.client.HTTPConnection("127.0.0.1", exporter.port, timeout=5)
                else:
                    conn = http.client.HTTPSConnection("127.0.0.1", exporter.port, timeout=5, context=tls)
                conn.request("GET", "/metrics")
                conn.getresponse().read()
                results[f"{name}.sigterm_exit_s"] = exporter.stop()
                conn.close()
    return results


def shutdown_with_stuck_client(tree: Path) -> dict[str, float]:
    with Exporter(tree) as exporter:
        sock = socket.create_connection(("127.0.0.1", exporter.port), timeout=5)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        sock.setblocking(False)
        sent = 0
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and sent < 2000:  # pipeline, never read
            try:
                sock.send(request)
                sent += 1
            except BlockingIOError:
                time.sleep(0.01)
        time.sleep(1.0)
        seconds = exporter.stop()
        sock.close()
        return {"sigterm_exit_s": seconds, "requests_pipelined": float(sent)}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def unread_body(tree: Path, seconds: float) -> dict[str, float]:
    with Exporter(tree) as exporter:
        assert exporter.proc is not None
        cpu = cpu_seconds(exporter.proc.pid)
        with socket.create_connection(("127.0.0.1", exporter.port), timeout=2) as sock:
            sock.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000000\r\n\r\n")
            status = int(sock.recv(4096).split(b" ", 2)[1])
            sent, chunk = 0, bytes(256 * 1024)
            until = time.monotonic() + seconds
            with contextlib.suppress(OSError):  # closed by the server, or a timeout: it stopped reading
                while time.monotonic() < until:
                    sock.sendall(chunk)
                    sent += len(chunk)
        cpu = cpu_seconds(exporter.proc.pid) - cpu
        exporter.stop()
        return {"status": float(status), "mib_sent_after_answer": sent / MIB, "server_cpu_s": cpu}


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def busy_clients(
    port: int, sources: list[str], per_source: int, request: Callable[[int], bytes], seconds: float
) -> list[threading.Thread]:
    """Connections from each source address that pipeline 50 requests, read the answers, and connect
    again when closed, until ``seconds`` have passed; ``request(n)`` is the n-th batch's request."""
    until = time.monotonic() + seconds

    def client(source: str) -> None:
        batch = 0
        while time.monotonic() < until:
            batch += 1
            try:
                with socket.create_connection(("127.0.0.1", port), 2, (source, 0)) as sock:
                    sock.settimeout(1.0)
                    sock.sendall(request(batch) * 50)
                    while time.monotonic() < until and sock.recv(65536):
                        pass
            except OSError:
                time.sleep(0.05)

    threads = [
        threading.Thread(target=client, args=(source,), daemon=True)
        for source in sources
        for _ in range(per_source)
    ]
    for thread in threads:
        thread.start()
    return threads


def fresh_scrapes(exporter: Exporter, seconds: float, headers: dict[str, str]) -> tuple[int, int, float]:
    """(answered 200, tried, slowest seconds) for a fresh /metrics client every 0.3 s."""
    ok = tried = 0
    slowest = 0.0
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        status, wait = exporter.get("/metrics", timeout=3, headers=headers)
        tried += 1
        ok += status == 200
        slowest = max(slowest, wait)
        time.sleep(0.3)
    return ok, tried, slowest


def busy_attack(tree: Path, connections: int, seconds: float) -> dict[str, float]:
    import bcrypt  # a dependency of smlens itself

    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(10)).decode()
    spread = [f"127.0.0.{n}" for n in range(2, 9)]
    variants: dict[str, tuple[bool, list[str], Callable[[int], bytes]]] = {
        "healthy": (False, ["127.0.0.2"], lambda _: b"GET /-/healthy HTTP/1.1\r\nHost: x\r\n\r\n"),
        "wrong_password": (True, ["127.0.0.2"], lambda _: _metrics_request(basic("prom", "wrong"))),
        "guessing_7_addresses": (True, spread, lambda n: _metrics_request(basic("prom", f"guess{n}"))),
    }
    results = {}
    with tempfile.TemporaryDirectory() as directory:
        web = Path(directory) / "web.yml"
        web.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
        for name, (auth, sources, request) in variants.items():
            args = ("--web-config-file", str(web)) if auth else ()
            headers = {"Authorization": basic("prom", "right")} if auth else {}
            with Exporter(tree, args=args) as exporter:
                if auth:  # ready answers without credentials; wait for one good scrape too
                    exporter.get("/metrics", timeout=5, headers=headers)
                per_source = max(1, connections // len(sources))
                threads = busy_clients(exporter.port, sources, per_source, request, seconds)
                time.sleep(1.0)
                ok, tried, slowest = fresh_scrapes(exporter, seconds - 1.5, headers)
                for thread in threads:
                    thread.join()
                results[f"{name}.fresh_ok_ratio"] = ok / max(tried, 1)
                results[f"{name}.fresh_scrapes"] = float(tried)
                results[f"{name}.fresh_slowest_s"] = slowest
                exporter.stop()
    return results


def _metrics_request(authorization: str) -> bytes:
    return f"GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: {authorization}\r\n\r\n".encode()


def run_tree(tree: Path, args: argparse.Namespace) -> dict[str, float]:
    scenarios = {
        "silent": lambda: silent_attack(tree, args.hold, None),
        "silent_emfile": lambda: silent_attack(tree, args.hold, 2000),
        "slowloris": lambda: slowloris(tree, args.slowloris),
        "half_open": lambda: half_open_attack(tree, args.half_open, args.trickle_rounds),
        "smuggle": lambda: smuggle(tree),
        "big_head": lambda: big_head(tree),
        "malformed": lambda: malformed_flood(tree, args.malformed),
        "tls_silent": lambda: tls_silent(tree, args.tls_silent),
        "shutdown": lambda: shutdown_with_stuck_client(tree),
        "idle_shutdown": lambda: idle_shutdown(tree),
        "unread_body": lambda: unread_body(tree, args.unread_seconds),
        "busy": lambda: busy_attack(tree, args.busy, args.busy_seconds),
    }
    results = {}
    for scenario, run in scenarios.items():
        if args.only and scenario not in args.only:
            continue
        for key, value in run().items():
            results[f"{scenario}.{key}"] = value
            print(f"  {scenario}.{key}: {value:.2f}", flush=True)
    return results


SCENARIOS = [
    "silent",
    "silent_emfile",
    "slowloris",
    "half_open",
    "smuggle",
    "big_head",
    "malformed",
    "tls_silent",
    "shutdown",
    "idle_shutdown",
    "unread_body",
    "busy",
]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--tree", type=Path, default=REPO / "exporter", help="tree to test (default: this one)"
    )
    parser.add_argument("--baseline-tree", type=Path, help="tree to compare with, e.g. an older commit's")
    parser.add_argument("--hold", type=float, default=20.0, help="seconds the silent connections are held")
    parser.add_argument("--half-open", type=int, default=8000, help="half-open connections")
    parser.add_argument("--trickle-rounds", type=int, default=5, help="one byte per connection per second")
    parser.add_argument("--malformed", type=int, default=2000, help="malformed requests")
    parser.add_argument("--unread-seconds", type=float, default=5.0, help="seconds of an unread body sent")
    parser.add_argument("--busy", type=int, default=70, help="busy pipelining connections")
    parser.add_argument("--busy-seconds", type=float, default=10.0, help="seconds each busy variant runs")
    parser.add_argument("--slowloris", type=int, default=200, help="trickling connections")
    parser.add_argument("--tls-silent", type=int, default=100, help="connections that never start TLS")
    parser.add_argument("--only", nargs="+", choices=SCENARIOS, help="these scenarios alone")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = max(args.half_open, 1100, args.slowloris, args.tls_silent) + 100
    if hard != resource.RLIM_INFINITY and hard < needed:
        print(f"need {needed} file descriptors, the hard limit is {hard}", file=sys.stderr)
        return 1
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    trees = {"after": args.tree}
    if args.baseline_tree:
        trees = {"before": args.baseline_tree, **trees}
    results = {}
    for name, tree in trees.items():
        print(f"[{name}] {tree}", flush=True)
        results[name] = run_tree(tree, args)
    print("(sigterm_exit_s inf: still running 20 s after SIGTERM, then killed)")
    print()
    names = list(trees)
    print("| figure | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for key in results[names[-1]]:
        print(f"| {key} | " + " | ".join(f"{results[n].get(key, float('nan')):.2f}" for n in names) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
