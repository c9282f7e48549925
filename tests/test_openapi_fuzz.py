"""Schemathesis against the application's own OpenAPI document, over every HTTP endpoint (the admin ones
included), through the same guard the server puts in front of it (basic auth, headers, HEAD).

No generated request may get a server error, a traceback or an unlabelled 5xx, and every status past the
guard must be one the document names for that operation (FastAPI writes it from the routes' response models
and declared responses); the run is bounded in examples per endpoint so that the suite stays fast.
"""

from __future__ import annotations

from pathlib import Path

import bcrypt
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import status_code_conformance

from smlens.exposition.rendered import Publisher
from smlens.pipeline.sampler import Sampler
from smlens.sources.sim import Scenario, SimBackend
from smlens.verdicts import thresholds
from smlens.web.admin import add_profiling_admin
from smlens.web.app import create_app
from smlens.web.guard import PROBES, Guard
from smlens.web.status.history import History
from smlens.web.webconfig import web_config_from

TOKEN = "a-token-of-more-than-16-characters"
AUTH = {"Authorization": "Basic cHJvbWV0aGV1czpzY3JhcGU="}  # prometheus:scrape
WEB = web_config_from(
    {
        "basic_auth_users": {"prometheus": bcrypt.hashpw(b"scrape", bcrypt.gensalt(4)).decode()},
        "http_server_config": {"headers": {"X-Frame-Options": "deny"}},
    },
    Path("web.yml"),
)


class Profiling:
    """The admin router's ProfilingControl (smlens' own protocol, no NVIDIA API behind it here)."""

    def __init__(self) -> None:
        self.paused = False

    def pause_profiling(self) -> None:
        self.paused = True

    def resume_profiling(self) -> None:
        self.paused = False


SAMPLER = Sampler(SimBackend(Scenario.steady(2), seed=1), [], hostname="fuzz", interval=1.0)
SAMPLER.open()


def _app() -> tuple[Guard, dict[str, object]]:
    publisher, history = Publisher(), History(thresholds.load())
    SAMPLER.subscribe(publisher.publish)
    SAMPLER.subscribe(history.record)
    for _ in range(3):
        SAMPLER.tick()
    app = create_app(publisher, thresholds.load(), lambda: True, history)
    add_profiling_admin(app, Profiling(), TOKEN)
    return Guard(app, lambda: WEB), app.openapi()


GUARDED, DOCUMENT = _app()
schema = schemathesis.openapi.from_dict(DOCUMENT)
schema.app = GUARDED


def test_the_document_covers_every_endpoint() -> None:
    paths = {(path, method) for path, item in DOCUMENT["paths"].items() for method in item}  # type: ignore[attr-defined]
    reads = ("/metrics", "/-/healthy", "/-/ready", "/api/v1/gpus", "/", "/api/v1/history", "/admin/profiling")
    assert paths == {(path, method) for path in reads for method in ("get", "head")} | {
        ("/admin/profiling/pause", "post"),
        ("/admin/profiling/resume", "post"),
    }


def test_the_document_is_valid_openapi() -> None:
    schema.validate()  # against the OpenAPI meta-schema


@schema.parametrize()
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case: schemathesis.Case) -> None:
    SAMPLER.tick()  # a fresh snapshot, as the running sampler keeps it: /-/ready is 503 only when stale
    for headers in (AUTH, {**AUTH, "X-Admin-Token": TOKEN}, {}):
        response = case.call(headers={**headers, **(case.headers or {})})
        assert response.status_code < 500, (case.path, response.status_code, response.text[:200])
        assert "Traceback" not in response.text
        assert response.headers.get("x-frame-options") == ["deny"]
        if not headers and case.path not in PROBES:
            assert response.status_code == 401, (case.method, case.path)
        elif headers:  # past the guard: the handler's answer is one the document names
            case.validate_response(response, checks=[status_code_conformance])


def test_admin_behind_basic_auth_takes_the_token_in_its_own_header() -> None:
    from starlette.testclient import TestClient

    http = TestClient(GUARDED)
    pause = "/admin/profiling/pause"
    assert http.post(pause, headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 401  # no basic auth
    assert http.post(pause, headers=AUTH).status_code == 401  # no token
    reply = http.post(pause, headers={**AUTH, "X-Admin-Token": TOKEN})
    assert (reply.status_code, reply.json()) == (200, {"paused": True})
    assert http.post("/admin/profiling/resume", headers={**AUTH, "X-Admin-Token": TOKEN}).json() == {
        "paused": False
    }
