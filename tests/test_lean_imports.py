"""What `smlens serve` imports without options: what it does not need must stay out of the process, since
every imported module stays resident (docs/performance.md, "Memory")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conftest import free_port

EXPORTER = Path(__file__).resolve().parent.parent / "exporter"
# Everything `smlens serve --backend sim` imports before it serves (cli._serve and runtime.build_sampler);
# test_serve_imports_what_serve_modules_import holds it to that.
SERVE_MODULES = (
    "smlens.cli",
    "smlens.web.admin",
    "smlens.web.app",
    "smlens.pipeline.heap",
    "smlens.pipeline.build",
    "smlens.web",
    "smlens.web.status.history",
    "smlens.sources.registry",
    "smlens.sources.sim",
    "smlens.pipeline.attribution",
)
# Never imported by serving without a web config file: each costs resident memory and serves nothing.
UNNEEDED = (
    "fastapi",
    "pydantic",
    "grpc",
    "smlens.web.webconfig_file",  # pydantic's models of the web config file
    "bcrypt",  # only to check basic_auth_users' passwords
    "importlib.metadata",  # smlens.__version__ is a literal
    "importlib.resources",  # the packaged files are read from their paths
    "uvicorn",  # smlens.web.http11 is the HTTP/1.1 protocol
    "click",  # uvicorn's command line, imported by its package
    "multiprocessing",  # uvicorn's supervisors, imported by its package
    "encodings.idna",  # a str host given to getaddrinfo brings it (with stringprep and unicodedata)
    "prometheus_client",  # smlens.textformat writes both formats; prometheus_client is the tests' oracle
    "http.server",  # prometheus_client's exposition module brought these four for its own servers
    "socketserver",
    "urllib.request",
    "wsgiref",
    "starlette",  # smlens.routing holds the routes
    "anyio",  # Starlette's thread pool and streams: plain handlers run on asyncio's
    "sniffio",
    "python_multipart",  # imported by starlette.requests whenever it is installed
    "typing_extensions",  # Starlette's; pydantic's too, with a web config file
    "http.client",  # Starlette's and prometheus_client's imports
    "mimetypes",
    "html",
    "email",  # the same, and email.utils for the Date header, which serving/http11.py now writes itself
)
# Runs `smlens serve --backend sim` on the main thread while another thread waits until it is ready, requests
# every page once, prints every module the process holds and ends it.
SERVE_AND_LIST = r"""
import json, os, socket, sys, threading, time, traceback
from smlens.cli import main

port = int(sys.argv[1])

def get(path):
    # raw: urllib would bring modules of its own (email, http.client, the idna codec) into the listed process
    with socket.create_connection((b"127.0.0.1", port), timeout=5) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: smlens\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])

def report():
    try:
        for _ in range(300):
            try:
                if get("/-/ready") == 200:
                    break
            except OSError:
                pass
            time.sleep(0.1)
        for path in ("/metrics", "/", "/static/status.js", "/api/v1/gpus", "/api/v1/history"):
            status = get(path)
            assert status == 200, (path, status)
        print(json.dumps(sorted(sys.modules)), flush=True)
        os._exit(0)
    except BaseException:
        traceback.print_exc()
        os._exit(1)

threading.Thread(target=report, daemon=True).start()
main(["serve", "--backend", "sim", "--interval", "0.2", "--listen", f"127.0.0.1:{port}"])
"""


def run(code: str, *args: str) -> str:
    """``code``'s output in a fresh interpreter with this one's path but without ``site``: a ``.pth`` file of
    the environment running the tests may import modules (importlib.resources here) that smlens' image does
    not, and hide that smlens imports them."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(EXPORTER), *filter(None, sys.path)])}
    command = [sys.executable, "-S", "-c", code, *args]
    return subprocess.run(command, capture_output=True, text=True, check=True, env=env, timeout=60).stdout


def loaded(statements: str, probe: tuple[str, ...]) -> list[str]:
    """Which of ``probe`` a fresh interpreter has imported after running ``statements``."""
    report = f"print(json.dumps(sorted(p for p in {list(probe)!r} if p in sys.modules)))"
    result: list[str] = json.loads(run(f"import json, sys\n{statements}\n{report}"))
    return result


def test_serving_loads_nothing_it_does_not_need() -> None:
    imports = "".join(f"import {module}\n" for module in SERVE_MODULES)
    assert loaded(imports, UNNEEDED) == []


def test_serve_imports_what_serve_modules_import() -> None:
    served = set(json.loads(run(SERVE_AND_LIST, str(free_port()))))
    assert sorted(served & set(UNNEEDED)) == []
    imports = "".join(f"import {module}\n" for module in SERVE_MODULES)
    listed = set(json.loads(run(f"import json, sys\n{imports}print(json.dumps(sorted(sys.modules)))")))

    def own(modules: set[str]) -> set[str]:
        return {m for m in modules if m.split(".")[0] == "smlens"}

    assert own(served) == own(listed)


def test_a_web_config_file_brings_its_schema() -> None:
    probe = ("pydantic", "smlens.web.webconfig_file")
    imports = "from pathlib import Path\nfrom smlens.web.webconfig import web_config_from\n"
    assert loaded(imports, probe) == []
    assert loaded(imports + "web_config_from({}, Path('web.yml'))", probe) == list(probe)


def test_a_password_check_brings_bcrypt() -> None:
    imports = "from smlens.web.webconfig import check_password\n"
    assert loaded(imports, ("bcrypt",)) == []
    assert loaded(imports + "check_password(b'not a hash', b'secret')", ("bcrypt",)) == ["bcrypt"]
