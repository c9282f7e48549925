"""The status page as a person sees it: headless Debian Chromium driven by Playwright.

Every request the page makes goes through a route that records its URL and refuses any that would
leave 127.0.0.1, so the test proves the page is self-contained, not only that it happens to render.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import yaml

from conftest import REPO, ExporterFactory, free_port, require_module, require_tool, wait_ready

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
POINT = re.compile(r"[ML](-?[\d.]+),(-?[\d.]+)")


@pytest.fixture
def browser() -> Iterator[Any]:
    chromium = require_tool("chromium")
    sync_api: Any = require_module("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        try:
            yield launched
        finally:
            launched.close()


def wait_for_poll(page: Any, requested: list[str], timeout: float = 15.0) -> None:
    """The page asks for new ticks only (``after=``) within ``timeout``: its first poll comes 2 s after
    the first load, which on a loaded machine may already have drawn every point the test waits for."""
    deadline = time.monotonic() + timeout
    while not any("/api/v1/history?after=" in url for url in requested):
        assert time.monotonic() < deadline, f"no polling request in {timeout} s: {requested}"
        page.wait_for_timeout(200)


def open_page(
    browser: Any, base: str, requested: list[str], errors: list[str], **context_options: Any
) -> Any:
    """A page whose every request is recorded; requests to anywhere but ``base``'s host are aborted.
    Script errors and console errors land in ``errors``."""
    context = browser.new_context(viewport={"width": 1280, "height": 900}, **context_options)
    host = urlsplit(base).hostname

    def route(handle: Any) -> None:
        requested.append(handle.request.url)
        if urlsplit(handle.request.url).hostname == host:
            handle.continue_()
        else:
            handle.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    return page


def points(page: Any, uuid: str, series: str) -> list[tuple[float, float]]:
    d = page.get_attribute(f'article.gpu[data-uuid="{uuid}"] svg.timeline path[data-series="{series}"]', "d")
    return [(float(x), float(y)) for x, y in POINT.findall(d or "")]


def axis_labels(page: Any, uuid: str) -> list[str]:
    return [t.strip() for t in page.locator(f'article.gpu[data-uuid="{uuid}"] .axis span').all_inner_texts()]


@contextmanager
def page_over_history(browser: Any, seconds: int) -> Iterator[tuple[Any, list[str]]]:
    """The status page over a history of ``seconds`` made up by tools/status_screenshot.py, which no
    sampler feeds afterwards; the page and the browser errors it logs."""
    sys.path.insert(0, str(REPO / "tools"))
    import status_screenshot  # tools/ is not a package

    publisher, history = status_screenshot.filled_history(interval=1.0, seconds=seconds)
    errors: list[str] = []
    with status_screenshot.serving(publisher, history, free_port()) as base:
        page = open_page(browser, base, [], errors)
        page.goto(base + "/")
        yield page, errors


def start_process(*args: str) -> tuple[str, subprocess.Popen[bytes]]:
    """``smlens serve --backend sim`` on a free port, for a test that stops it; its base URL and process."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "smlens", "serve", "--backend", "sim", "--listen", f"127.0.0.1:{port}", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO / "exporter")},
    )
    base = f"http://127.0.0.1:{port}"
    wait_ready(base + "/-/ready", process)
    return base, process


def test_status_page_flags_hollow_gpus_draws_timelines_and_refreshes(
    start_exporter: ExporterFactory, browser: Any, tmp_path: Path
) -> None:
    base = start_exporter("--backend", "sim", "--interval", "0.5", "--hostname", "browser-node")
    requested: list[str] = []
    errors: list[str] = []
    page = open_page(browser, base, requested, errors)
    page.goto(base + "/")
    page.wait_for_function("() => document.querySelectorAll('article.gpu[data-verdict]').length === 8")
    page.wait_for_function(
        "() => [...document.querySelectorAll('path[data-series=sm_active]')]"
        ".every(p => (p.getAttribute('d') || '').split('L').length > 3)"
    )
    api = {g["uuid"]: g for g in httpx.get(base + "/api/v1/gpus").json()["gpus"]}
    rows = page.locator("article.gpu")
    shown = {
        rows.nth(i).get_attribute("data-uuid"): rows.nth(i).get_attribute("data-verdict") for i in range(8)
    }
    assert shown == {uuid: gpu["verdict"]["code"] for uuid, gpu in api.items()}
    assert "browser-node" in page.inner_text("header")

    hollow = [uuid for uuid, code in shown.items() if code == "hollow"]
    assert [api[uuid]["index"] for uuid in hollow] == [1, 2]
    assert page.inner_text("#summary") == "2 of 8 GPU(s) busy but with their SMs mostly idle."
    for uuid in hollow:
        row = page.locator(f'article.gpu[data-uuid="{uuid}"]')
        assert "bad" in (row.get_attribute("class") or "").split()
        assert "busy but SMs mostly idle" in row.locator(".verdict").inner_text()
        # Drawn, not only present: utilization near the top, SM active near the bottom of the 0..100 box.
        util, sm = points(page, uuid, "utilization"), points(page, uuid, "sm_active")
        assert len(util) >= 3 and len(sm) >= 3
        assert all(y < 10 for _, y in util) and all(y > 80 for _, y in sm)
        assert row.locator("svg.timeline rect.band").count() >= 1  # the hollow stretch is shaded
        assert row.locator("svg.timeline").bounding_box()["width"] > 300
    working = page.locator('article.gpu[data-verdict="compute_bound"]')
    assert working.count() == 1 and working.locator("rect.band").count() == 0
    first = page.locator("article.gpu").first
    assert "held by ml-training/llm-pretrain-0/trainer" in first.locator(".owner").inner_text()
    assert first.locator(".profiling").inner_text() == "SM metrics from sim"
    numbers = first.locator("dl.numbers").inner_text()
    assert "W of 700 W" in numbers and "GiB" in numbers and "%" in numbers

    # Refresh without reload: a marker set on the window survives while new points arrive.
    uuid = hollow[0]
    before = len(points(page, uuid, "utilization"))
    page.evaluate("window.smlensMarker = 42")
    page.wait_for_function(
        f"() => document.querySelector('article.gpu[data-uuid=\"{uuid}\"] path[data-series=utilization]')"
        f".getAttribute('d').split('L').length > {before + 3}",
        timeout=8000,
    )
    assert page.evaluate("window.smlensMarker") == 42
    wait_for_poll(page, requested)
    page.screenshot(path=str(tmp_path / "status.png"))
    assert (tmp_path / "status.png").stat().st_size > 10_000

    # The links lead to live data.
    page.click('a[href="api/v1/gpus"]')
    assert [g["verdict"]["code"] for g in json.loads(page.inner_text("body"))["gpus"]][:3] == [
        "compute_bound",
        "hollow",
        "hollow",
    ]
    page.goto(base + "/")
    page.click('a[href="metrics"]')
    assert "gpu_sm_active_ratio{" in page.inner_text("body")

    assert requested and all(urlsplit(url).hostname == "127.0.0.1" for url in requested), requested
    assert errors == []


@pytest.mark.parametrize("answers", [1, 10])
def test_timelines_span_fifteen_minutes_at_the_sampling_interval(
    browser: Any, monkeypatch: pytest.MonkeyPatch, answers: int
) -> None:
    sys.path.insert(0, str(REPO / "tools"))
    import status_screenshot  # tools/ is not a package

    from smlens.web.status import page as status_page

    if answers > 1:  # a capped window: the page must fetch the rest at once and join the answers
        monkeypatch.setattr(status_page, "MAX_VALUES_PER_ANSWER", 8 * 901 // answers + 8)

    publisher, history = status_screenshot.filled_history(interval=1.0)
    requested: list[str] = []
    errors: list[str] = []
    with status_screenshot.serving(publisher, history, free_port()) as base:
        page = open_page(browser, base, requested, errors)
        page.goto(base + "/")
        page.wait_for_selector("article.gpu[data-verdict] path[data-series=utilization][d^=M]")
        api = httpx.get(base + "/api/v1/gpus").json()["gpus"]
        turned, ended = api[1]["uuid"], api[6]["uuid"]
        deadline = time.monotonic() + 10  # capped answers follow each other at once: well under a poll
        while len(util := points(page, turned, "utilization")) < 900 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sum("api/v1/history" in url for url in requested) >= answers
        # 901 ticks, the first only primes the counters: 900 points, one a second, oldest at the left.
        assert len(util) == 900
        assert axis_labels(page, turned) == ["-15 min", "-10 min", "-5 min", "now"]
        assert util[0][0] < 3 and util[-1][0] == 900.0
        steps = [b[0] - a[0] for a, b in itertools.pairwise(util)]
        assert max(steps) - min(steps) < 0.15
        # The scenario's GPU 1 turned hollow 6 minutes before the end: its band covers the last 6 minutes.
        band = page.locator(f'article.gpu[data-uuid="{turned}"] rect.band')
        assert band.count() == 1
        assert float(band.get_attribute("x") or 0) == pytest.approx(900 * 9 / 15, abs=2)
        assert "(6 min 0 s)" in page.locator(f'article.gpu[data-uuid="{turned}"] .since').inner_text()
        # GPU 6's job ended 8 minutes before the end: SM active high, then at 0.
        sm = points(page, ended, "sm_active")
        assert all(y < 20 for x, y in sm if x < 900 * 6.5 / 15) and all(
            y > 95 for x, y in sm if x > 900 * 7.5 / 15
        )
        assert errors == []
    assert all(urlsplit(url).hostname == "127.0.0.1" for url in requested), requested


def test_status_page_works_behind_the_web_configs_basic_auth(
    start_exporter: ExporterFactory, browser: Any, tmp_path: Path
) -> None:
    bcrypt = require_module("bcrypt")
    web = tmp_path / "web.yml"
    hashed = bcrypt.hashpw(b"page-secret", bcrypt.gensalt(4)).decode()
    web.write_text(yaml.safe_dump({"basic_auth_users": {"sre": hashed}}))
    base = start_exporter("--backend", "sim", "--interval", "0.5", "--web-config-file", str(web))
    for path in ("/", "/static/status.js", "/api/v1/history"):
        assert httpx.get(base + path).status_code == 401, path
    requested: list[str] = []
    errors: list[str] = []
    page = open_page(
        browser, base, requested, errors, http_credentials={"username": "sre", "password": "page-secret"}
    )
    assert page.goto(base + "/").status == 200
    page.wait_for_function("() => document.querySelectorAll('article.gpu[data-verdict=hollow]').length === 2")
    page.wait_for_function(
        "() => [...document.querySelectorAll('path[data-series=utilization]')]"
        ".every(p => (p.getAttribute('d') || '').split('L').length > 3)"
    )
    wait_for_poll(page, requested)  # polling passes the auth too
    assert all(urlsplit(url).hostname == "127.0.0.1" for url in requested), requested
    assert errors == []


UNKNOWN_AND_HELD = """
gpus:
  - healthy
  - {profile: healthy, unreadable: [profiling]}
  - phases:
      - {profile: healthy, seconds: 1}
      - {profile: healthy, seconds: 1000000, unreadable: [gpu]}
  - idle_memory_held
  - idle
"""
NOTEBOOK = "pods:\n  - {namespace: research, pod: notebook-bob, container: jupyter, gpus: [3]}\n"
CLOCK = r"\d{1,2}:\d{2}:\d{2}(\s?[AP]M)?"


def test_header_says_what_is_unknown_and_what_is_held_idle_in_words(
    start_exporter: ExporterFactory, browser: Any, tmp_path: Path
) -> None:
    """A lost GPU and one without SM metrics are unknown, not "not busy"; a GPU whose memory a notebook
    holds while idle does not look like a free one; reasons read as words, not codes."""
    (tmp_path / "node.yaml").write_text(UNKNOWN_AND_HELD)
    (tmp_path / "pods.yaml").write_text(NOTEBOOK)
    base = start_exporter(
        "--backend", "sim", "--interval", "0.5", "--sim-scenario", str(tmp_path / "node.yaml"),
        "--sim-pods", str(tmp_path / "pods.yaml"),
    )  # fmt: skip
    requested: list[str] = []
    errors: list[str] = []
    page = open_page(browser, base, requested, errors)
    page.goto(base + "/")
    page.wait_for_function("() => (document.getElementById('unknown') || {}).textContent?.includes('lost')")
    assert page.inner_text("#summary") == "None of the 3 GPU(s) that can be judged is busy with its SMs idle."
    assert "No GPU is busy" not in page.inner_text("header")
    assert re.fullmatch(
        rf"Unknown, whether hollow or not: GPU 2 lost \(not readable since {CLOCK}\); "
        r"GPU 1 without SM metrics \(from sim: not supported by this GPU\)\.",
        page.inner_text("#unknown"),
    ), page.inner_text("#unknown")
    assert page.inner_text("#held-idle") == (
        "Held but idle (no kernels run): GPU 3 holds 98.7 GiB of memory for research/notebook-bob/jupyter."
    )
    api = httpx.get(base + "/api/v1/gpus").json()["gpus"]
    assert [g["memory_held"] for g in api] == [True, True, False, True, False]
    rows = page.locator("article.gpu")
    held, free = rows.nth(3), rows.nth(4)
    assert (held.get_attribute("data-verdict"), free.get_attribute("data-verdict")) == (
        "idle_memory_held",
        "idle",
    )
    assert "held" in (held.get_attribute("class") or "").split()
    assert "held" not in (free.get_attribute("class") or "").split()
    assert "98.7 GiB of memory held" in held.locator(".held-note").inner_text()
    assert free.locator(".held-note").inner_text() == ""
    assert held.evaluate("e => getComputedStyle(e).borderLeftColor") != free.evaluate(
        "e => getComputedStyle(e).borderLeftColor"
    )
    # Reasons in words: the profiling line, the lost GPU's verdict and the tooltips of absent values.
    blind = rows.nth(1)
    assert (
        blind.locator(".profiling").inner_text()
        == "SM metrics unavailable from sim: not supported by this GPU"
    )
    assert blind.locator('dd[data-key="sm_occupancy"]').get_attribute("title") == "not supported by this GPU"
    assert rows.nth(2).locator(".verdict").inner_text() == "lost: not readable"
    assert "not_supported" not in page.inner_text("body")
    assert errors == []


MIG_NODE = """
gpus:
  - healthy
  - mig: [{mig_profile: 3g.71gb, profile: healthy}, {mig_profile: 1g.18gb, profile: hollow},
          {mig_profile: 1g.18gb, profile: idle}]
"""


def test_mig_instances_get_rows_with_their_own_verdicts(
    start_exporter: ExporterFactory, browser: Any, tmp_path: Path
) -> None:
    (tmp_path / "mig.yaml").write_text(MIG_NODE)
    base = start_exporter(
        "--backend", "sim", "--interval", "0.5", "--sim-scenario", str(tmp_path / "mig.yaml")
    )
    requested: list[str] = []
    errors: list[str] = []
    page = open_page(browser, base, requested, errors)
    page.goto(base + "/")
    page.wait_for_selector("article.gpu section.instance[data-verdict]")
    split = httpx.get(base + "/api/v1/gpus", params={"gpu": "1"}).json()["gpus"][0]
    assert [i["verdict"]["code"] for i in split["instances"]] == ["compute_bound", "hollow", "idle"]
    row = page.locator(f'article.gpu[data-uuid="{split["uuid"]}"]')
    instances = row.locator("section.instance")
    shown = [
        (instances.nth(i).get_attribute("data-gpu-instance"), instances.nth(i).get_attribute("data-verdict"))
        for i in range(instances.count())
    ]
    assert shown == [(str(i["gpu_instance"]), i["verdict"]["code"]) for i in split["instances"]]
    hollow = row.locator('section.instance[data-verdict="hollow"]')
    assert "bad" in (hollow.get_attribute("class") or "").split()
    assert "MIG 1g.18gb" in hollow.inner_text() and "held but SMs mostly idle" in hollow.inner_text()
    assert "MIG mode: 3 GPU instance(s)" in row.locator(".mig").inner_text()
    assert page.locator("article.gpu").first.locator("section.instance").count() == 0
    summary = page.locator("#summary")
    assert summary.inner_text() == (
        "1 MIG instance(s) held but with their SMs mostly idle: GPU 1 MIG instance 2 (1g.18gb)."
    )
    assert summary.get_attribute("class") == "bad"
    assert errors == []


def test_a_short_history_fills_the_timeline_with_both_axes_labelled_and_bars_in_the_legends_colours(
    browser: Any,
) -> None:
    with page_over_history(browser, seconds=200) as (page, errors):
        page.wait_for_selector("article.gpu[data-verdict] path[data-series=utilization][d^=M]")
        uuid = page.locator("article.gpu").first.get_attribute("data-uuid")
        util = points(page, uuid, "utilization")
        # 200 s of history span the whole width, not the right 200/900 of a 15-minute axis.
        assert len(util) == 200 and util[0][0] < 10 and util[-1][0] == 900.0
        assert axis_labels(page, uuid) == ["-3 min", "-2 min", "-1 min", "now"]
        for row in page.locator("article.gpu").all():
            assert [t.strip() for t in row.locator(".yaxis span").all_inner_texts()] == [
                "100 %",
                "50 %",
                "0 %",
            ]
        style = "e => [getComputedStyle(e).backgroundColor, getComputedStyle(e).opacity]"
        for key in ("sm_occupancy", "tensor_active", "dram_active"):
            legend = page.locator(f"#legend .key.{key}").evaluate(style)
            bars = page.locator(f"dd[data-key={key}] .mini.{key} span")
            assert bars.count() == 8
            assert {tuple(b.evaluate(style)) for b in bars.all()} == {tuple(legend)}, key
        for key in ("utilization", "sm_active"):
            legend = page.locator(f"#legend .key.{key}").evaluate(style)
            assert page.locator(f".vbar.{key} .fill").first.evaluate(style) == legend, key
        assert errors == []


def test_the_page_marks_its_data_stale_and_says_since_when(browser: Any, tmp_path: Path) -> None:
    base, process = start_process("--interval", "0.5")
    requested: list[str] = []
    errors: list[str] = []
    try:
        page = open_page(browser, base, requested, errors)
        page.goto(base + "/")
        page.wait_for_selector("article.gpu[data-verdict]")
        wait_for_poll(page, requested)
        assert page.locator("#stale").is_hidden()
        assert "stale" not in (page.get_attribute("body", "class") or "")
        assert page.locator("main").evaluate("e => getComputedStyle(e).opacity") == "1"
    finally:
        process.terminate()
        process.wait(timeout=10)
    page.wait_for_selector("#stale", state="visible", timeout=10_000)
    assert re.fullmatch(
        rf"Stale since {CLOCK}: the exporter has not answered since then; what is shown is its last answer\.",
        page.inner_text("#stale"),
    ), page.inner_text("#stale")
    assert "stale" in (page.get_attribute("body", "class") or "").split()
    assert float(page.locator("main").evaluate("e => getComputedStyle(e).opacity")) < 0.6
    assert page.locator("article.gpu").count() == 8  # the last answer stays, dimmed
    page.screenshot(path=str(tmp_path / "stale.png"))
    assert not [e for e in errors if "ERR_CONNECTION_REFUSED" not in e]


def test_the_page_marks_its_data_stale_when_the_sampler_stalls(browser: Any) -> None:
    """The exporter answers, but with a sample that grows old (here: nobody feeds the history)."""
    with page_over_history(browser, seconds=30) as (page, errors):
        page.wait_for_selector("#stale", state="visible", timeout=15_000)
        assert re.fullmatch(
            rf"Stale since {CLOCK}: the exporter answers, but has taken no sample since then\.",
            page.inner_text("#stale"),
        ), page.inner_text("#stale")
        assert "stale" in (page.get_attribute("body", "class") or "").split()
        assert errors == []
