"""The exporter as an unprivileged user: which metric families it still gets, and why others are absent.

That decides the Helm chart's security settings. Needs root (to switch to the user ``nobody``).
"""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.truth.exporter import METRIC_GROUP_ARGS, REPO, Exporter, smlens_env

USER = "nobody"


@dataclass(frozen=True)
class UnprivilegedRun:
    ran: bool
    reason: str  # why not, when not
    user: str = USER
    families: tuple[str, ...] = ()  # per-GPU families the user got
    lacking: tuple[str, ...] = ()  # per-GPU families root got and the user did not
    profiling: Mapping[str, Any] = field(default_factory=dict)  # /api/v1/gpus "profiling" of the GPU
    missing: Mapping[str, str] = field(default_factory=dict)  # /api/v1/gpus "missing" of the GPU


def run_unprivileged(
    root_families: set[str], gpu: int, log: Path, interval: float, settle: float
) -> UnprivilegedRun:
    """Serve as ``nobody`` for ``settle`` seconds (long enough for every cadence), then compare."""
    if os.getuid() != 0:
        return UnprivilegedRun(False, "the harness is not root, so it cannot switch users")
    try:
        account = pwd.getpwnam(USER)
    except KeyError:
        return UnprivilegedRun(False, f"no user {USER!r} on this machine")
    with tempfile.TemporaryDirectory(prefix="smlens-truth-") as scratch:
        # A copy of the source, readable by anyone: the checkout may sit in a directory only root reads.
        source = Path(scratch) / "exporter"
        shutil.copytree(REPO / "exporter", source, ignore=shutil.ignore_patterns("__pycache__"))
        for path in [Path(scratch), *Path(scratch).rglob("*")]:
            path.chmod(0o755)
        env = smlens_env(source, HOME=scratch, PYTHONDONTWRITEBYTECODE="1")
        try:
            with Exporter(
                log,
                interval,
                *METRIC_GROUP_ARGS,
                env=env,
                user=account.pw_uid,
                group=account.pw_gid,
                cwd=Path(scratch),
            ) as exporter:
                exporter.wait_ready()
                time.sleep(settle)
                scrape, gpus = exporter.scrape(), exporter.gpus()
        except Exception as exc:
            return UnprivilegedRun(False, f"the exporter did not serve as {USER}: {exc}")
    state: dict[str, Any] = next((g for g in gpus["gpus"] if g["index"] == gpu), {})
    families = scrape.families(gpu=str(gpu))
    return UnprivilegedRun(
        True,
        "",
        families=tuple(sorted(families)),
        lacking=tuple(sorted(root_families - families)),
        profiling=state.get("profiling", {}),
        missing=state.get("missing", {}),
    )
