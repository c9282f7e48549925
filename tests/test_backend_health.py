"""Backend health on its own: up means every read of the tick succeeded; one log line per change."""

from __future__ import annotations

import logging

import pytest

from smlens.pipeline.backend_health import BackendHealth


def tick(health: BackendHealth, *failures: str) -> bool:
    health.begin_tick()
    for gpu in failures:
        health.failed("timeout", f"{gpu}: no answer")
    health.end_tick()
    return health.up


def test_one_failing_gpu_marks_the_backend_down_for_that_tick_only() -> None:
    health = BackendHealth("gpm")
    assert tick(health) is True
    assert tick(health, "GPU 0") is False  # GPU 1 read fine, but GPU 0 did not
    assert tick(health) is True
    assert health.errors == {"timeout": 1} and health.samples == 3


def test_a_lost_gpu_is_counted_but_does_not_take_the_backend_down() -> None:
    health = BackendHealth("nvml")
    health.begin_tick()
    health.gpu_lost("gpu_lost")
    health.end_tick()
    assert health.up is True and health.errors == {"gpu_lost": 1}


def test_state_changes_are_logged_once_not_once_per_tick(caplog: pytest.LogCaptureFixture) -> None:
    health = BackendHealth("gpm")
    with caplog.at_level(logging.INFO, logger="smlens.pipeline.backend_health"):
        for _ in range(5):
            tick(health, "GPU 0 (GPU-a)")
        for _ in range(3):
            tick(health)
        tick(health, "GPU 1 (GPU-b)", "GPU 0 (GPU-a)")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("WARNING", "backend gpm is down: GPU 0 (GPU-a): no answer"),
        ("INFO", "backend gpm is up again: it read every GPU it serves"),
        ("WARNING", "backend gpm is down: GPU 1 (GPU-b): no answer"),
    ]


def test_durations_are_per_tick_and_cumulative() -> None:
    health = BackendHealth("sim")
    for seconds in (0.5, 0.25):
        health.begin_tick()
        health.spent(seconds)
        health.spent(seconds)
        health.end_tick()
    stats = health.stats()
    assert stats.last_duration_seconds == 0.5 and stats.duration_seconds_total == 1.5
    assert (stats.name, stats.up, stats.samples_total) == ("sim", True, 2)


def test_stats_follow_new_errors_and_earlier_stats_keep_their_counts() -> None:
    health = BackendHealth("gpm")
    tick(health, "GPU 0")
    before = health.stats()
    assert health.stats().errors_total is before.errors_total  # unchanged errors: the same read-only copy
    tick(health, "GPU 0", "GPU 1")
    health.gpu_lost("gpu_lost")
    assert dict(before.errors_total) == {"timeout": 1}
    assert dict(health.stats().errors_total) == {"timeout": 3, "gpu_lost": 1}
