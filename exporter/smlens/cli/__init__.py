"""The ``smlens`` command: ``serve`` runs the exporter, ``check`` judges this node once, ``report`` sums
GPU-hours per verdict class and owner from Prometheus.

Each command first resolves its settings and reads every file it names (thresholds, admin token, sim
scenario) and only then opens NVML, starts threads or binds a socket, so a bad value or file is one
sentence and exit 1 with nothing started.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import shutil
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from smlens import __version__
from smlens import names as n
from smlens.errors import ConfigError, SmlensError
from smlens.profile.command import add_parser as add_profile_parser
from smlens.settings import (
    NOT_PAUSABLE,
    CheckSettings,
    ReportSettings,
    ServeSettings,
    SourceSettings,
    add_flags,
    resolve,
)
from smlens.sources.base import ProfilingControl
from smlens.verdicts import thresholds

if TYPE_CHECKING:
    from smlens.pipeline.sampler import Sampler

log = logging.getLogger("smlens")

HELP_WIDTH = 100  # --help wraps at the terminal's width, and never wider than this


class _Parser(argparse.ArgumentParser):
    """Bad flags get one line and exit 2, not a usage dump."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"smlens: {message} (see '{self.prog} --help')\n")


def _formatter(prog: str) -> argparse.HelpFormatter:
    width = min(shutil.get_terminal_size().columns, HELP_WIDTH)
    return argparse.HelpFormatter(prog, max_help_position=28, width=width)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="smlens",
        description="GPU SM activity and occupancy as Prometheus metrics.",
        formatter_class=_formatter,
    )
    parser.add_argument("--version", action="version", version=f"smlens {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    for name, summary in (
        ("serve", "run the exporter"),
        ("check", "sample this node for a few seconds and print a verdict per GPU"),
        ("report", "GPU-hours per verdict class and owner over a range, and their cost, from Prometheus"),
    ):
        sub = commands.add_parser(
            name,
            help=summary,
            description=f"{summary[0].upper()}{summary[1:]}. Every option can also come from the "
            "environment or a config file; flags win over the environment, which wins over the file.",
            usage=f"smlens {name} [options]",
            formatter_class=_formatter,
        )
        add_flags(sub, name)
    add_profile_parser(commands, _formatter)
    return parser


def _admin_control(sampler: Sampler) -> ProfilingControl:
    control = next((b for b in sampler.backends if isinstance(b, ProfilingControl)), None)
    if control is None:
        raise ConfigError(NOT_PAUSABLE)  # auto/dcgm: DCGM's presence is known only once it is opened
    return control


def _serve(settings: ServeSettings) -> int:
    from smlens.exposition.live import SnapshotAge, live_registry
    from smlens.exposition.rendered import Publisher
    from smlens.pipeline.accounting import Accountant
    from smlens.pipeline.attribution import read_sim_pods
    from smlens.pipeline.build import build_sampler
    from smlens.pipeline.heap import release_after_start_up
    from smlens.web.admin import add_profiling_admin, read_token
    from smlens.web.app import create_app
    from smlens.web.server import open_server
    from smlens.web.status.history import History

    limits = thresholds.load(settings.thresholds)
    if not settings.metrics.exports(n.GPU_SM_ACTIVE_SECONDS):
        log.warning("--metrics leaves out activity: the shipped rules and dashboards read it and go empty")
    token = read_token(settings.admin_token_file) if settings.admin_token_file else None
    sim_pods = read_sim_pods(settings)
    server = open_server(settings)
    try:
        sampler = build_sampler(settings, sim_pods)
        try:
            if settings.metrics.exports(n.GPU_VERDICT_SECONDS):
                sampler.attach_accountant(Accountant(limits, sampler.interval))
            publisher, history = Publisher(settings.metrics), History(limits)
            live = live_registry(server.stats, SnapshotAge(lambda: sampler.latest))
            sampler.subscribe(publisher.publish)
            sampler.subscribe(history.record)
            app = create_app(publisher, limits, sampler.alive, history, live)
            if token is not None:
                add_profiling_admin(app, _admin_control(sampler), token)
            sampler.subscribe(release_after_start_up)
            sampler.start()
            log.info(
                "serving %d GPU(s) on %s://%s:%d/metrics (backend %s, interval %.2f s)",
                len(sampler.gpus),
                server.scheme,
                settings.listen[0],
                server.port,
                settings.backend,
                settings.interval,
            )
            server.run(app)
        finally:
            sampler.close()
            log.info("stopped; data sources closed")
    finally:
        server.sock.close()
    return 0


def _check(settings: CheckSettings) -> int:
    from smlens.cli.check import matched, render_json, render_table, report, sample
    from smlens.pipeline.build import build_sampler

    limits = thresholds.load(settings.thresholds)
    # Utilization must be read inside the short window, not only every --utilization-interval.
    window = dataclasses.replace(
        settings, utilization_interval=min(settings.utilization_interval, settings.duration / 2)
    )
    sampler = build_sampler(window)
    try:
        print(
            f"smlens check: sampling {len(sampler.gpus)} GPU(s) "
            f"({' + '.join(b.name for b in sampler.backends)}) for {settings.duration:g} s ...",
            file=sys.stderr,
            flush=True,
        )
        first, last = sample(sampler, settings.duration)
    finally:
        sampler.close()
    reports = report(first, last, limits)
    if settings.json:
        print(render_json(settings.node_name, settings.duration, reports))
    else:
        print(render_table(reports))
    failed = matched(reports, settings.fail_on)
    if failed is None:
        return 0
    print(failed, file=sys.stderr)
    return 3


def _report(settings: ReportSettings) -> int:
    from smlens.report.command import run

    return run(settings)


def _run(settings: SourceSettings | ReportSettings) -> int:
    """The handler of the command whose settings these are, whatever -O does to asserts."""
    if isinstance(settings, ReportSettings):
        return _report(settings)
    if isinstance(settings, ServeSettings):
        return _serve(settings)
    if isinstance(settings, CheckSettings):
        return _check(settings)
    raise TypeError(f"no handler for {type(settings).__name__}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "profile":
            from smlens.profile.command import run as profile

            status = profile(args)
        else:
            settings = resolve(args.command, vars(args))
            logging.basicConfig(
                level=settings.log_level.upper(),
                stream=sys.stderr,
                format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            )
            status = _run(settings)
        sys.stdout.flush()  # here, where a reader that left is caught, not in Python's exit flush
        return status
    except SmlensError as exc:
        print(f"smlens: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader of stdout left (`smlens check --json | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's exit flush would fail too
        return 141  # 128 + SIGPIPE, as a shell reports a tool that the signal ended


if __name__ == "__main__":
    sys.exit(main())
