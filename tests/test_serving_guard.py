"""The guard in front of the application, in process: rate limit and basic auth against the probes."""

from __future__ import annotations

import base64
from pathlib import Path

import bcrypt
import pytest
from starlette.responses import PlainTextResponse
from starlette.routing import Route, Router
from starlette.testclient import TestClient

from smlens.web import guard
from smlens.web.guard import Guard
from smlens.web.webconfig import check_password, web_config_from

OK = Router(
    [Route(path, lambda _: PlainTextResponse("OK")) for path in ("/metrics", "/-/healthy", "/-/ready")]
)


def _client(tmp_path: Path, protect_probes: bool) -> TestClient:
    config = web_config_from({"rate_limit": {"interval": "1s", "burst": 2}}, tmp_path / "web.yml")
    return TestClient(Guard(OK, lambda: config, protect_probes, clock=lambda: 0.0))


def test_rate_limit_leaves_the_probes_to_the_kubelet(tmp_path: Path) -> None:
    client = _client(tmp_path, protect_probes=False)
    assert [client.get("/metrics").status_code for _ in range(4)] == [200, 200, 429, 429]
    assert [client.get(p).status_code for p in ("/-/healthy", "/-/ready") * 3] == [200] * 6


def test_rate_limit_covers_the_probes_with_protect_probes(tmp_path: Path) -> None:
    client = _client(tmp_path, protect_probes=True)
    assert [client.get("/-/ready").status_code for _ in range(3)] == [200, 200, 429]


def test_wrong_passwords_are_hashed_once_and_a_few_per_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed: list[bytes] = []

    def counting(hash_: bytes, password: bytes) -> bool:
        hashed.append(password)
        return check_password(hash_, password)

    monkeypatch.setattr(guard, "check_password", counting)
    users = {"basic_auth_users": {"prometheus": bcrypt.hashpw(b"right", bcrypt.gensalt(4)).decode()}}
    config = web_config_from(users, tmp_path / "web.yml")
    app = Guard(OK, lambda: config, clock=lambda: 0.0)
    attacker = TestClient(app, client=("127.0.0.2", 1234))
    for _ in range(20):
        assert attacker.get("/metrics", auth=("prometheus", "wrong")).status_code == 401
    assert hashed == [b"wrong"]
    for n in range(20):
        assert attacker.get("/metrics", auth=("prometheus", f"guess{n}")).status_code == 401
    assert len(hashed) == guard.CHECKS_BURST  # "wrong" took one of the burst
    prometheus = TestClient(app, client=("127.0.0.1", 1234))
    assert prometheus.get("/metrics", auth=("prometheus", "right")).status_code == 200


def test_a_user_name_that_is_not_utf8_is_an_unknown_user(tmp_path: Path) -> None:
    users = {"basic_auth_users": {"\ufffd": bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()}}
    config = web_config_from(users, tmp_path / "web.yml")
    client = TestClient(Guard(OK, lambda: config))

    def auth(user: bytes) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(user + b":pw").decode()}

    assert client.get("/metrics", headers=auth("\ufffd".encode())).status_code == 200
    assert client.get("/metrics", headers=auth(b"\xff")).status_code == 401
