"""Counters of the HTTP layer, exported on /metrics: what it closed and why, what it could not parse."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

CLOSE_REASONS = (
    "per_address",  # dropped to keep its client address within its share of --web-max-connections
    "evicted",  # dropped to make room under --web-max-connections, or when out of file descriptors
    "header_timeout",  # no complete request within --web-header-timeout
    "idle_timeout",  # keep-alive connection idle past --web-idle-timeout
    "response_timeout",  # the client did not take the response in time
    "tls_handshake",  # the TLS handshake failed or timed out
    "client_sans",  # the client certificate had none of client_allowed_sans
    "shutdown",  # still open when the shutdown deadline passed
)


@dataclass(eq=False)  # a collector in a prometheus_client registry: hashed by identity
class ServingStats:
    open_connections: int = 0
    closed: Counter[str] = field(default_factory=Counter)
    malformed_requests: int = 0
    accept_errors: int = 0
    reloads: Counter[str] = field(default_factory=Counter)

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "smlens_http_open_connections", "HTTP connections open now.", value=self.open_connections
        )
        closed = CounterMetricFamily(
            "smlens_http_connections_closed",
            "HTTP connections the server closed on its own, by reason.",
            labels=["reason"],
        )
        for reason in CLOSE_REASONS:
            closed.add_metric([reason], self.closed[reason])
        yield closed
        yield CounterMetricFamily(
            "smlens_http_malformed_requests",
            "Requests that were not valid HTTP/1.1 (answered 400, not logged).",
            value=self.malformed_requests,
        )
        yield CounterMetricFamily(
            "smlens_http_accept_errors",
            "Failures to accept a connection, e.g. out of file descriptors.",
            value=self.accept_errors,
        )
        reloads = CounterMetricFamily(
            "smlens_web_config_reloads",
            "Reloads of the web config file (SIGHUP or a changed file), by result.",
            labels=["result"],
        )
        for result in ("success", "failure"):
            reloads.add_metric([result], self.reloads[result])
        yield reloads
