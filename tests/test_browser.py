"""The landing page as a person sees it: headless Debian Chromium driven by Playwright."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import ExporterFactory, require_module, require_tool

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def test_landing_page_links_lead_to_live_data(start_exporter: ExporterFactory, tmp_path: Path) -> None:
    chromium = require_tool("chromium")
    sync_api: Any = require_module("playwright.sync_api")
    base = start_exporter("--backend", "sim", "--interval", "0.5", "--hostname", "browser-node")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page()
            page.goto(base + "/")
            assert "browser-node" in page.inner_text("body")
            page.screenshot(path=str(tmp_path / "landing.png"))
            page.click('a[href="api/v1/gpus"]')
            payload = json.loads(page.inner_text("body"))
            assert [g["verdict"]["code"] for g in payload["gpus"]][:3] == ["working", "hollow", "hollow"]
            page.goto(base + "/")
            page.click('a[href="metrics"]')
            assert "gpu_sm_active_ratio{" in page.inner_text("body")
        finally:
            browser.close()
    assert (tmp_path / "landing.png").stat().st_size > 1000
