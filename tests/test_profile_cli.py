"""`smlens profile` where users meet it: the command line, the files it writes and the report in a browser.
The capture itself needs a GPU (bench/truth/profile_truth.py); everything after it runs here on a capture
recorded on an H200."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from conftest import REPO, require_tool, run_cli
from smlens.cli import main
from smlens.profile import analysis
from smlens.profile.recording import Recording
from smlens.verdicts import thresholds

FIXTURE = Path(__file__).parent / "fixtures" / "profile" / "h200_schedule.json.gz"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    out = tmp_path_factory.mktemp("profile")
    html, js = out / "report.html", out / "capture.json"
    done = run_cli("profile", "--from-json", str(FIXTURE), "--out", str(html), "--json", str(js))
    assert done.returncode == 0, done.stderr
    return html, js, done.stdout


def test_summary_names_the_step_and_the_hollow_share(report: tuple[Path, Path, str]) -> None:
    _, js, stdout = report
    summary = json.loads(js.read_text())["summary"]
    share = analysis.hollow_share(analysis.series(Recording.load(FIXTURE)), thresholds.load())
    assert summary["hollow_share_of_busy"] == pytest.approx(share)
    assert f"hollow share of busy time {100 * share:5.1f} %" in stdout
    period = summary["step"]["seconds"]
    assert f"step period {1e3 * period:.2f} ms" in stdout
    assert "NVIDIA H200" in stdout


def test_json_holds_every_sample_and_reloads(report: tuple[Path, Path, str]) -> None:
    _, js, _ = report
    again = Recording.load(js)
    assert len(again) == len(Recording.load(FIXTURE))


def test_report_is_self_contained(report: tuple[Path, Path, str]) -> None:
    html, _, _ = report
    page = html.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<link" not in page and "@import" not in page
    data = re.search(r'<script type="application/json" id="timeline-data">(.*?)</script>', page, re.S)
    assert data is not None
    timeline = json.loads(data.group(1))
    assert set(timeline["series"]) == {"busy", "sm_active", "occupancy", "tensor", "dram"}
    assert len(timeline["t_ms"]) == len(Recording.load(FIXTURE))


def test_report_timeline_zooms_in_a_browser(report: tuple[Path, Path, str]) -> None:
    chromium = require_tool("chromium")
    sync_api = pytest.importorskip("playwright.sync_api")
    html, _, _ = report
    errors: list[str] = []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(html.as_uri())
            full = page.evaluate("hi - lo")
            box = page.locator("#timeline").bounding_box()
            assert box is not None
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            page.mouse.wheel(0, -300)
            zoomed = page.evaluate("hi - lo")
            painted = page.evaluate(
                "(() => { const c = document.getElementById('timeline');"
                " const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
                " let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i]) n++; return n; })()"
            )
            page.dblclick("#timeline")
            reset = page.evaluate("hi - lo")
        finally:
            browser.close()
    assert errors == []
    assert 0 < zoomed < full and reset == pytest.approx(full)
    assert painted > 1000


def test_report_to_stdout(tmp_path: Path) -> None:
    done = run_cli("profile", "--from-json", str(FIXTURE), "--out", "-")
    assert done.returncode == 0
    assert done.stdout.startswith("<!doctype html>")
    assert "step period" in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--interval-us", "50"], "--interval-us must be 100 (10 kHz) to 1000000 (1 Hz), got 50."),
        (
            ["--interval-us", "10000000"],
            "--interval-us must be 100 (10 kHz) to 1000000 (1 Hz), got 10000000.",
        ),
        (["--seconds", "0.5", "--interval-us", "600000"], "--interval-us 600000 is longer than the capture"),
        (["--seconds", "0"], "--seconds must be above 0 and at most 600, got 0."),
        (["--seconds", "nan"], "--seconds must be above 0 and at most 600, got nan."),
        (["--out", "/nonexistent/r.html"], "cannot write /nonexistent/r.html: No such file or directory."),
        (["--json", "/"], "cannot write /: Is a directory."),
        (
            ["--from-json", "/nonexistent.json"],
            "cannot read profile recording /nonexistent.json: No such file or directory.",
        ),
    ],
)
def test_bad_input_gets_one_sentence(args: list[str], message: str) -> None:
    done = run_cli("profile", *args)
    assert done.returncode == 1
    assert done.stderr.startswith(f"smlens: {message}")
    assert len(done.stderr.strip().splitlines()) == 1


def test_without_cupti_python_one_sentence_and_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupti", None)  # what Python does for a package that is not installed
    err = io.StringIO()
    with redirect_stderr(err):
        code = main(["profile", "--seconds", "1"])
    assert code == 1
    assert err.getvalue() == (
        "smlens: smlens profile needs NVIDIA's cupti-python, which is not installed: "
        "pip install 'smlens[profile]'.\n"
    )


# Runs smlens where neither numpy nor cupti-python is installed: importing either fails as it would there.
WITHOUT_THE_EXTRA = """
import runpy, sys

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("numpy", "cupti"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
sys.argv[0] = "smlens"
runpy.run_module("smlens", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize(
    ("args", "needs"),
    [
        (["--seconds", "1"], "NVIDIA's cupti-python and numpy, which are"),
        (["--from-json", str(FIXTURE)], "numpy, which is"),  # an analysis without a capture needs no CUPTI
    ],
    ids=["capture", "from-json"],
)
def test_without_the_extra_one_sentence_names_the_install(
    tmp_path: Path, args: list[str], needs: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_THE_EXTRA, "profile", *args, "--out", str(tmp_path / "r.html")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO / "exporter")},
    )
    assert done.returncode == 1, done.stderr
    assert (
        done.stderr == f"smlens: smlens profile needs {needs} not installed: pip install 'smlens[profile]'.\n"
    )
    assert not (tmp_path / "r.html").exists()


def test_a_recording_with_zero_peaks_gets_one_sentence(tmp_path: Path) -> None:
    capture = Recording.load(FIXTURE).to_json()
    capture["peaks"] = dict.fromkeys(capture["peaks"], 0)
    zero = tmp_path / "peaks0.json"
    zero.write_text(json.dumps(capture))
    done = run_cli("profile", "--from-json", str(zero), "--out", str(tmp_path / "r.html"))
    assert done.returncode == 1
    assert done.stderr.startswith("smlens: the peak of ")
    assert len(done.stderr.strip().splitlines()) == 1
