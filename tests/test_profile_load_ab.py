"""bench/truth/profile_load.py's A/B arms without a GPU: the bare PM sampling capture
(bench/truth/pm_quiet.py) through the cupti-python 13.4.0 double, the CLI arm's handshake with a stand-in
for ``smlens profile``, and the checks on ``--arms``."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from bench.truth import profile_load
from bench.truth.pm_quiet import PROBE_METRICS, QuietCapture, QuietSpec

ROOT = Path(__file__).resolve().parents[1]


def test_the_bare_capture_uses_the_sysclk_trigger_and_says_how_long_it_sampled(cupti: Any) -> None:
    with QuietCapture(QuietSpec(PROBE_METRICS, 200_000, sysclk=True)) as quiet:
        assert quiet._collector.trigger_mode == cupti.PmSamplingTriggerMode.GPU_SYSCLK_INTERVAL
        assert quiet._collector._metrics == list(PROBE_METRICS)
        quiet.start()
        cupti.HARDWARE.feed(301)  # the double's records are 200,000 ns apart; the first has no start
        result = quiet.finish(0.06)
    assert result == {"samples": 301, "image_full": False, "span_ms": 60.0, "sample_us": 200.0}


def test_the_time_trigger_is_the_default_and_an_overflow_is_reported_not_raised(cupti: Any) -> None:
    with QuietCapture(QuietSpec(PROBE_METRICS, 100_000)) as quiet:
        assert quiet._collector.trigger_mode == cupti.PmSamplingTriggerMode.GPU_TIME_INTERVAL
        quiet.start()
        cupti.HARDWARE.capacity = 10
        cupti.HARDWARE.feed(11)
        assert "overflow" in quiet.finish(0.001)["error"]


def test_a_decode_image_has_room_for_the_shortest_sysclk_period() -> None:
    assert QuietSpec(PROBE_METRICS, 100_000).slots(3) == 36_000 + 1000
    assert QuietSpec(PROBE_METRICS, 200_000, sysclk=True).slots(3) == 36_000 + 1000  # 100 us at 2 GHz


STAND_IN = textwrap.dedent(
    """
    import json, sys, time
    args = sys.argv[1:]
    seconds, out = float(args[args.index("--seconds") + 1]), args[args.index("--json") + 1]
    if MODE == "refuse":
        print("smlens: another profiler holds GPU 0's performance counters.", file=sys.stderr)
        sys.exit(1)
    time.sleep(0.5)  # importing CUPTI, opening the session
    began = time.monotonic()
    time.sleep(0.2)
    open(MARK, "w").write(str(time.monotonic()))
    print("\\rcapturing   0.2/%g s, 2000 samples decoded" % seconds, end="", file=sys.stderr, flush=True)
    time.sleep(seconds - 0.2)
    json.dump({"capture": {"samples": [[1, 2]] * 7, "notes": {"images_filled": 0}}}, open(out, "w"))
    """
)


class FakeBlocks:
    def __init__(self) -> None:
        self.started: list[float] = []

    def start_block(self, command: str = "go") -> None:
        assert command == "go"
        self.started.append(time.monotonic())

    def wait_block(self, tick: Any = None) -> dict[str, Any]:
        time.sleep(0.3)
        return {"tflops": 600.0, "ms": 300.0}


def stand_in(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, mode: str) -> Path:
    mark = tmp_path / "capturing"
    code = f"MODE, MARK = {mode!r}, {str(mark)!r}\n" + STAND_IN
    monkeypatch.setattr(profile_load, "PROFILE", [sys.executable, "-c", code])
    return mark


def test_the_cli_arm_times_its_block_only_once_the_capture_process_is_sampling(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    mark = stand_in(monkeypatch, tmp_path, "capture")
    blocks = FakeBlocks()
    block, note = profile_load.cli_block(blocks, 0.3, lambda: None)  # type: ignore[arg-type]
    assert block == {"tflops": 600.0, "ms": 300.0}
    assert blocks.started[0] > float(mark.read_text())  # after the capture said it was sampling
    assert note == {"rc": 0, "block_inside_capture": True, "samples": 7, "notes": {"images_filled": 0}}


def test_a_cli_capture_that_cannot_start_stops_the_arm_with_its_sentence(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    stand_in(monkeypatch, tmp_path, "refuse")
    blocks = FakeBlocks()
    with pytest.raises(RuntimeError, match="another profiler holds GPU 0"):
        profile_load.cli_block(blocks, 0.3, lambda: None)  # type: ignore[arg-type]
    assert blocks.started == []


@pytest.mark.parametrize(
    ("arms", "sentence"),
    [("off,bogus", "unknown arm 'bogus'"), ("on,cli", "must include off")],
)
def test_arms_are_checked_before_anything_runs(tmp_path: Path, arms: str, sentence: str) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'exporter'}:{ROOT}"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.truth.profile_load",
            "--out",
            str(tmp_path),
            "--sections",
            "ab",
            "--arms",
            arms,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert sentence in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "profile_load.json").exists()
