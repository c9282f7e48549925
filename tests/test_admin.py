"""The admin router: bearer-token auth, and how profiling pause/resume outcomes map to HTTP."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from smlens.errors import BackendError, ConfigError
from smlens.web.admin import add_profiling_admin

TOKEN = "s3cret-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Control:
    """Records calls; fails with ``error`` when set."""

    def __init__(self) -> None:
        self.paused = False
        self.calls: list[str] = []
        self.error: BackendError | None = None

    def _do(self, pause: bool) -> None:
        self.calls.append("pause" if pause else "resume")
        if self.error is not None:
            raise self.error
        self.paused = pause

    def pause_profiling(self) -> None:
        self._do(True)

    def resume_profiling(self) -> None:
        self._do(False)


def client(control: Control) -> TestClient:
    app = FastAPI()
    add_profiling_admin(app, control, TOKEN)
    return TestClient(app)


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Bearer wrong-token-0123456789"},
        {"Authorization": f"Basic {TOKEN}"},
        {"X-Admin-Token": "wrong-token-0123456789"},
        {"X-Admin-Token": ""},
    ],
)
def test_every_call_needs_the_token(headers: dict[str, str]) -> None:
    control = Control()
    http = client(control)
    for method, path in (("GET", ""), ("POST", "/pause"), ("POST", "/resume")):
        reply = http.request(method, f"/admin/profiling{path}", headers=headers)
        assert reply.status_code == 401
        assert reply.headers["www-authenticate"] == "Bearer"
        assert "Bearer" in reply.json()["error"]
    assert control.calls == []


def test_pause_then_resume() -> None:
    control = Control()
    http = client(control)
    assert http.get("/admin/profiling", headers=AUTH).json() == {"paused": False}
    reply = http.post("/admin/profiling/pause", headers=AUTH)
    assert reply.status_code == 200 and reply.json() == {"paused": True}
    assert http.get("/admin/profiling", headers=AUTH).json() == {"paused": True}
    assert http.post("/admin/profiling/resume", headers=AUTH).json() == {"paused": False}
    assert control.calls == ["pause", "resume"]


@pytest.mark.parametrize(("reason", "status"), [("not_supported", 409), ("hostengine_unreachable", 503)])
def test_backend_failures_are_one_sentence_and_a_status(reason: str, status: int) -> None:
    control = Control()
    control.error = BackendError("DCGM cannot pause profiling on this node.", reason=reason)
    reply = client(control).post("/admin/profiling/pause", headers=AUTH)
    assert reply.status_code == status
    assert reply.json() == {"error": "DCGM cannot pause profiling on this node.", "reason": reason}
    assert not control.paused


def test_weak_token_is_refused() -> None:
    with pytest.raises(ConfigError, match="at least 16 characters"):
        add_profiling_admin(FastAPI(), Control(), "short")


@pytest.mark.parametrize("token", ["ключ-доступа-16+символов", "tab\tinside-0123456789"])
def test_a_token_no_client_can_send_as_configured_is_refused(token: str) -> None:
    with pytest.raises(ConfigError, match="printable ASCII"):
        add_profiling_admin(FastAPI(), Control(), token)


def test_a_header_with_bytes_beyond_ascii_is_denied_not_an_error() -> None:
    reply = client(Control()).get(
        "/admin/profiling", headers={"X-Admin-Token": "s3cret-token-012345678\xe9".encode("latin-1")}
    )
    assert reply.status_code == 401


def test_a_token_file_without_end_is_one_sentence() -> None:
    from pathlib import Path

    from smlens.web.admin import read_token

    with pytest.raises(ConfigError, match=r"admin token file /dev/zero is larger than 4096 bytes"):
        read_token(Path("/dev/zero"))
