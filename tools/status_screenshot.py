"""Screenshots of the status page holding 15 minutes of simulated history, for the README and docs/.

    PYTHONPATH=exporter python tools/status_screenshot.py docs/status-page.png docs/status-page-top.png

The sim node's GPUs change state during the 15 minutes (a job turns hollow, another ends), and the
sampler runs on a simulated clock, so the timelines are full without waiting 15 minutes. Chromium is
Debian's (/usr/bin/chromium), driven by Playwright; Pillow shrinks the PNGs.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from PIL import Image
from playwright.sync_api import sync_playwright

from smlens.exposition.rendered import Publisher
from smlens.pipeline.attribution import build_refresher
from smlens.pipeline.sampler import Sampler
from smlens.settings import resolve
from smlens.sources.sim import PROFILES, Phase, Scenario, SimBackend
from smlens.verdicts import thresholds
from smlens.web.app import create_app
from smlens.web.status.history import WINDOW_SECONDS, History

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]
LONG = 10 * WINDOW_SECONDS  # a phase that outlasts the history


def _phases(*steps: tuple[str, float]) -> tuple[Phase, ...]:
    return tuple(Phase(PROFILES[name], seconds) for name, seconds in steps)


SCENARIO = Scenario(
    (
        _phases(("healthy", 0.0)),
        _phases(("healthy", 540.0), ("hollow", LONG)),  # turned hollow six minutes ago
        _phases(("single_sm", 0.0)),
        _phases(("idle", 200.0), ("low_occupancy", LONG)),
        _phases(("memory_bound", 0.0)),
        _phases(("launch_bound", 0.0)),
        _phases(("healthy", 420.0), ("idle", LONG)),  # its job ended eight minutes ago
        _phases(("idle_memory_held", 0.0)),
    )
)


def filled_history(
    interval: float = 1.0, seconds: float = WINDOW_SECONDS, end: float | None = None
) -> tuple[Publisher, History]:
    """A publisher and a history fed ``seconds`` of the scenario, ending at unix time ``end`` (default: now),
    on a simulated clock."""
    now = [(time.time() if end is None else end) - seconds]
    sim = SimBackend(SCENARIO, hostname_hint="gpu-node-17")
    sampler = Sampler(
        sim, [], hostname="gpu-node-17", interval=interval, clock=lambda: now[0], wall=lambda: now[0]
    )
    gpus = sampler.open()
    refresher = build_refresher(resolve("serve", {"backend": "sim"}, environ={}), gpus)
    if refresher is not None:
        refresher.refresh()
        sampler.attach_attribution(refresher)
    limits = thresholds.load()
    publisher, history = Publisher(), History(limits)
    sampler.subscribe(publisher.publish)
    sampler.subscribe(history.record)
    for _ in range(round(seconds / interval) + 1):
        sampler.tick()
        now[0] += interval
    return publisher, history


@contextmanager
def serving(publisher: Publisher, history: History, port: int) -> Iterator[str]:
    """Serve the app with uvicorn on 127.0.0.1:``port`` in a thread; yields its base URL."""
    app = create_app(publisher, thresholds.load(), lambda: True, history)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)  # the caller's thread may run Playwright's loop
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError(f"the status page server did not start on port {port}")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def shrink(path: Path) -> None:
    """Rewrite a screenshot with a 128-colour palette: a third of the size, no visible change."""
    with Image.open(path) as image:
        small = image.convert("RGB").quantize(128, method=Image.Quantize.FASTOCTREE, dither=Image.Dither.NONE)
    small.save(path, optimize=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("full", type=Path, help="PNG of the whole page")
    parser.add_argument("top", type=Path, help="PNG of the header and the first four GPUs")
    parser.add_argument("--port", type=int, default=18132)
    args = parser.parse_args(argv)
    # The page dims a sample older than 5 s as stale: end the history after the screenshots are taken.
    publisher, history = filled_history(end=time.time() + 60)
    with serving(publisher, history, args.port) as base, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.goto(base + "/")
        page.wait_for_selector("article.gpu[data-verdict] svg path[d^='M']")
        page.screenshot(path=str(args.full), full_page=True)
        fourth = page.locator("article.gpu").nth(3).bounding_box()
        assert fourth is not None
        height = fourth["y"] + fourth["height"] + 6
        page.screenshot(path=str(args.top), clip={"x": 0, "y": 0, "width": 1280, "height": height})
        browser.close()
    for path in (args.full, args.top):
        shrink(path)
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
