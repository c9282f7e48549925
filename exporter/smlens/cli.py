"""The ``smlens`` command: ``serve`` runs the exporter, ``check`` judges this node once."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from smlens import __version__, thresholds
from smlens.config import Settings, add_flags, resolve
from smlens.errors import SmlensError

if TYPE_CHECKING:
    from fastapi import FastAPI

    from smlens.sampler import Sampler

log = logging.getLogger("smlens")


class _Parser(argparse.ArgumentParser):
    """Bad flags get one line and exit 2, not a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"smlens: {message} (see '{self.prog} --help')\n")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="smlens", description="GPU SM activity and occupancy as Prometheus metrics.")
    parser.add_argument("--version", action="version", version=f"smlens {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    serve = commands.add_parser("serve", help="run the exporter")
    add_flags(serve, "serve")
    check = commands.add_parser(
        "check", help="sample this node for a few seconds and print a verdict per GPU"
    )
    add_flags(check, "check")
    check.add_argument("--duration", type=float, default=3.0, help="seconds to sample (default 3)")
    check.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return parser


def _read_token(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError as exc:
        raise SmlensError(f"cannot read admin token file {path}: {exc.strerror}.") from exc


def _mount_admin(app: FastAPI, sampler: Sampler, token: str) -> None:
    from smlens.admin import profiling_router
    from smlens.backends.dcgm import DcgmBackend

    dcgm = next((b for b in sampler.backends if isinstance(b, DcgmBackend)), None)
    if dcgm is None:
        sampler.close()
        raise SmlensError(
            "--admin-token-file enables DCGM profiling pause/resume, but DCGM is not in use here."
        )
    app.include_router(profiling_router(dcgm, token))


def _serve(settings: Settings) -> int:
    import uvicorn

    from smlens.app import Publisher, create_app
    from smlens.runtime import build_sampler

    limits = thresholds.load(settings.thresholds)
    token = _read_token(settings.admin_token_file) if settings.admin_token_file else None
    sampler = build_sampler(settings)
    publisher = Publisher()
    sampler.subscribe(publisher.publish)
    sampler.start()
    host, port = settings.listen
    log.info(
        "serving %d GPU(s) on http://%s:%d/metrics (backend %s, interval %.2f s)",
        len(sampler.gpus),
        host,
        port,
        settings.backend,
        settings.interval,
    )
    app = create_app(publisher, limits, sampler.alive)
    if token is not None:
        _mount_admin(app, sampler, token)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
    server = uvicorn.Server(config)
    try:
        server.run()
    finally:
        sampler.close()
    return 0 if server.started else 1


def _check(settings: Settings, seconds: float, as_json: bool) -> int:
    from smlens.check import render_json, render_table, report, sample
    from smlens.runtime import build_sampler

    if not 0.5 <= seconds <= 600:
        raise SmlensError(f"--duration must be from 0.5 to 600 seconds, got {seconds}.")
    limits = thresholds.load(settings.thresholds)
    # Utilization must be read inside the short window, not only every --utilization-interval.
    window = dict(settings.values, utilization_interval=min(settings.utilization_interval, seconds / 2))
    sampler = build_sampler(Settings(window))
    try:
        first, last = sample(sampler, seconds)
    finally:
        sampler.close()
    reports = report(first, last, limits)
    print(render_json(settings.node_name, seconds, reports) if as_json else render_table(reports))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = resolve(args.command, vars(args))
        logging.basicConfig(
            level=settings.log_level.upper(),
            stream=sys.stderr,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        if args.command == "serve":
            return _serve(settings)
        return _check(settings, args.duration, args.json)
    except SmlensError as exc:
        print(f"smlens: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
