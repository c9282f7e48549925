"""What `smlens serve` imports without options: what it does not need must stay out of the process, since
every imported module stays resident (docs/performance.md, "Memory")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

EXPORTER = Path(__file__).resolve().parent.parent / "exporter"
# Everything `smlens serve --backend sim` imports before it serves (cli._serve and runtime.build_sampler).
SERVE_MODULES = (
    "smlens.cli",
    "smlens.admin",
    "smlens.app",
    "smlens.runtime",
    "smlens.serving",
    "smlens.status.history",
    "smlens.backends.registry",
    "smlens.attribution.setup",
)


def loaded(statements: str, probe: tuple[str, ...]) -> list[str]:
    """Which of ``probe`` a fresh interpreter has imported after running ``statements``."""
    report = f"print(json.dumps(sorted(p for p in {list(probe)!r} if p in sys.modules)))"
    code = f"import json, sys\n{statements}\n{report}"
    env = {**os.environ, "PYTHONPATH": str(EXPORTER)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    result: list[str] = json.loads(out.stdout)
    return result


def test_serving_loads_neither_fastapi_nor_pydantic_nor_grpc() -> None:
    imports = "".join(f"import {module}\n" for module in SERVE_MODULES)
    assert loaded(imports, ("fastapi", "pydantic", "grpc", "smlens.serving.webconfig_file")) == []


def test_a_web_config_file_brings_its_schema() -> None:
    probe = ("pydantic", "smlens.serving.webconfig_file")
    imports = "from pathlib import Path\nfrom smlens.serving.webconfig import web_config_from\n"
    assert loaded(imports, probe) == []
    assert loaded(imports + "web_config_from({}, Path('web.yml'))", probe) == list(probe)
