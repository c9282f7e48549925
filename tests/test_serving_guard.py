"""The guard in front of the application, in process: rate limit and basic auth against the probes."""

from __future__ import annotations

from pathlib import Path

from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from smlens.serving.guard import Guard
from smlens.serving.webconfig import web_config_from


def _client(tmp_path: Path, protect_probes: bool) -> TestClient:
    config = web_config_from({"rate_limit": {"interval": "1s", "burst": 2}}, tmp_path / "web.yml")
    ok = Route("/{path:path}", lambda _: PlainTextResponse("OK"))
    return TestClient(Guard(Starlette(routes=[ok]), lambda: config, protect_probes, clock=lambda: 0.0))


def test_rate_limit_leaves_the_probes_to_the_kubelet(tmp_path: Path) -> None:
    client = _client(tmp_path, protect_probes=False)
    assert [client.get("/metrics").status_code for _ in range(4)] == [200, 200, 429, 429]
    assert [client.get(p).status_code for p in ("/-/healthy", "/-/ready") * 3] == [200] * 6


def test_rate_limit_covers_the_probes_with_protect_probes(tmp_path: Path) -> None:
    client = _client(tmp_path, protect_probes=True)
    assert [client.get("/-/ready").status_code for _ in range(3)] == [200, 200, 429]
