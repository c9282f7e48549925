"""What `smlens profile` costs and how it coexists, on a GPU under load.

    PYTHONPATH=exporter python3 -m bench.truth.profile_load --out DIR [--sections ab,coexist,example,long]
        [--long 100,200] [--seconds 60] [--rounds 6] [--arms off,on,on_quiet,on_1ms] [--serve-path DIR]

* ``long``: for each interval (us) of ``--long``, ``smlens profile --seconds S`` (the CLI, in its own process)
  while a bf16 GEMM loop runs in another: samples kept and dropped and why (the capture's notes), overflow,
  the CLI's CPU time (its evaluator process included) and peak RSS, the wall time to the report.
* ``ab``: interleaved blocks of the same GEMMs in a child process, timed there with CUDA events, one block
  per arm and round (rounds rotate the order), with the mean SM clock (NVML) of each block; the arms are
  ``ARMS`` (``--arms``, ``off`` among them): smlens' Session in this process (decoding during the block
  or after it, at 100 us or 1 ms), the real CLI in its own process, a bare Collector with the first probe's
  four metrics (GPU time or SYSCLK trigger), and the probe's layout (the GEMM process captures itself).
* ``coexist``: a second capture during one; a capture while Nsight Compute profiles another process;
  ``smlens serve`` (NVML + GPM) scraped every second before, during and after a capture of a GEMM loop.
* ``example``: a 12 s capture at 200 us of the truth schedule, as a user would take one.
Writes DIR/profile_load.json (and prints each result as it comes).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import select
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from bench.truth.pm_quiet import PROBE_METRICS, QuietCapture, QuietSpec
from bench.truth.profile_truth import Child

PROFILE = [sys.executable, "-m", "smlens", "profile", "--gpu", "0"]
NCU_WORKLOAD = (
    "import torch\n"
    "a = torch.randn(4096, 4096, device='cuda', dtype=torch.bfloat16)\n"
    "for _ in range(400): torch.matmul(a, a)\n"
    "torch.cuda.synchronize()\n"
)


def say(result: dict[str, Any]) -> dict[str, Any]:
    print(json.dumps(result), flush=True)
    return result


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def profile_cli(seconds: float, interval_us: int, tag: str, keep: Path | None = None) -> dict[str, Any]:
    """One ``smlens profile`` run; the notes and summary of its --json."""
    html, data = Path(f"/tmp/{tag}.html"), Path(f"/tmp/{tag}.json")
    cpu, t = children_cpu(), time.perf_counter()
    command = [*PROFILE, "--seconds", str(seconds), "--interval-us", str(interval_us), "--out", str(html)]
    done = subprocess.run(
        [*command, "--json", str(data)],
        capture_output=True,
        text=True,
        timeout=seconds + 240,
    )
    result: dict[str, Any] = {
        "rc": done.returncode,
        "wall_s": round(time.perf_counter() - t, 2),
        "cpu_s": round(children_cpu() - cpu, 2),
        "stdout": done.stdout[-1500:],
        "stderr": done.stderr[-400:].split("\r")[-1],
    }
    if done.returncode == 0:
        capture = json.loads(data.read_text())["capture"]
        rows = np.asarray(capture["samples"], dtype=np.float64)
        start, end = rows[:, 0], rows[:, 1]
        span = float(end.max() - start.min())
        result.update(
            samples=len(rows),
            span_s=round(span / 1e9, 3),
            covered_share=round(float((end - start).sum()) / span, 5),
            expected_samples=round(span / (interval_us * 1000)),
            notes=capture["notes"],
            cpu_s_per_10k=round(10_000 * result["cpu_s"] / len(rows), 3),
        )
        if keep is not None:
            keep.write_text(done.stdout)
    data.unlink(missing_ok=True)
    return result


def long_section(intervals: list[int], seconds: float) -> list[dict[str, Any]]:
    results = []
    for interval in intervals:
        load = Child("gemm-rate", "--seconds", str(seconds + 12))
        load.go()
        time.sleep(2)
        run = profile_cli(seconds, interval, f"long{interval}")
        results.append(say({"section": "long", "interval_us": interval, **run, "gemm": load.result()}))
    return results


class Blocks:
    """The gemm-blocks child: one block per ``start_block`` (``go``, or ``probe`` for a block under a capture
    made by the child itself); ``wait_block`` returns the child's line (TFLOP/s, and that capture)."""

    def __init__(self, seconds: float) -> None:
        self.child = Child("gemm-blocks", "--seconds", str(seconds))

    def start_block(self, command: str = "go") -> None:
        stdin = self.child.process.stdin
        assert stdin is not None
        stdin.write(f"{command}\n")
        stdin.flush()

    def wait_block(self, tick: Callable[[], None] | None = None) -> dict[str, Any]:
        stdout = self.child.process.stdout
        assert stdout is not None
        while not select.select([stdout], [], [], 0.05)[0]:
            if tick is not None:
                tick()
        return dict(json.loads(stdout.readline()))

    def close(self) -> None:
        self.start_block("quit")
        self.child.process.wait(timeout=60)


# smlens' Session in this process: (interval in ns, hardware buffer MiB, decode during the block)
SESSION_ARMS = {
    "on": (100_000, 256, True),
    "on_quiet": (100_000, 2048, False),
    "on_1ms": (1_000_000, 256, True),
}
QUIET_ARMS = {  # a bare Collector in this process, nothing decoded during the block (bench/truth/pm_quiet.py)
    "four": QuietSpec(PROBE_METRICS, 100_000),
    "sysclk": QuietSpec(PROBE_METRICS, 200_000, sysclk=True),
}
ARMS = {
    "off": "no capture",
    "on": "smlens' Session in the bench process at 100 us, decoding during the block",
    "on_quiet": "the same with a 2 GiB hardware buffer, decoded after the block",
    "on_1ms": "the same as on, at 1 ms",
    "cli": "`smlens profile --interval-us 100` in its own process, started before the block",
    "four": "the probe's four metrics, GPU time trigger 100 us, in the bench process",
    "sysclk": "the probe's four metrics, SYSCLK trigger every 200,000 cycles, in the bench process",
    "probe": "the probe's four metrics at 100 us, captured by the GEMM process itself (the probe's layout)",
}


class Clocks:
    """The SM clock (NVML) read every tick during a block."""

    def __init__(self, index: int) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self.mhz: list[int] = []

    def tick(self) -> None:
        self.mhz.append(int(self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM)))

    def take(self) -> float:
        mean, self.mhz = (float(np.mean(self.mhz)) if self.mhz else 0.0), []
        return round(mean, 1)


def cli_block(
    blocks: Blocks, seconds: float, tick: Callable[[], None]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A block while ``smlens profile`` captures in its own process; the block starts once the CLI prints
    its first progress line (it is sampling) and must end before the capture does."""
    length = seconds + 1.5  # the block starts about 0.2 s into the capture
    data = Path("/tmp/ab_cli.json")
    data.unlink(missing_ok=True)
    command = [*PROFILE, "--seconds", str(length), "--interval-us", "100", "--out", "/tmp/ab_cli.html"]
    capture = subprocess.Popen(
        [*command, "--json", str(data)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert capture.stderr is not None
    seen, began = b"", None
    deadline = time.monotonic() + 120
    while began is None and capture.poll() is None and time.monotonic() < deadline:
        if select.select([capture.stderr], [], [], 0.05)[0]:
            seen += os.read(capture.stderr.fileno(), 4096)
            if match := re.search(rb"capturing +([0-9.]+)/", seen):
                began = time.monotonic() - float(match.group(1))
    if began is None:
        capture.kill()
        _, err = capture.communicate()
        raise RuntimeError(f"smlens profile did not start capturing: {(seen + err).decode()[-400:]}")
    blocks.start_block()
    block = blocks.wait_block(tick)
    inside = time.monotonic() < began + length
    _, err = capture.communicate(timeout=240)
    note: dict[str, Any] = {"rc": capture.returncode, "block_inside_capture": inside}
    if capture.returncode == 0:
        recorded = json.loads(data.read_text())["capture"]
        note.update(samples=len(recorded["samples"]), notes=recorded["notes"])
    else:
        note["stderr"] = (seen + err).decode()[-400:].split("\r")[-1]
    return block, note


def ab_block(arm: str, blocks: Blocks, gpu: Any, seconds: float, clocks: Clocks) -> dict[str, Any]:
    """One block of ``arm``: the child's line, the mean SM clock, and what the capture recorded."""
    from smlens.profile.cupti_session import Session

    note: dict[str, Any] = {}
    if arm == "off":
        blocks.start_block()
        block = blocks.wait_block(clocks.tick)
    elif arm == "probe":
        blocks.start_block("probe")
        block = blocks.wait_block(clocks.tick)
        if "error" in block:
            raise RuntimeError(block["error"])
        note = block.pop("capture")
    elif arm == "cli":
        block, note = cli_block(blocks, seconds, clocks.tick)
    elif arm in QUIET_ARMS:
        with QuietCapture(QUIET_ARMS[arm], gpu.cuda_ordinal) as quiet:
            quiet.start()
            blocks.start_block()
            block = blocks.wait_block(clocks.tick)
            note = quiet.finish(block["ms"] / 1000)
    else:
        interval, mib, decode = SESSION_ARMS[arm]
        with Session(gpu, interval, mib * 2**20) as session:

            def tick() -> None:
                clocks.tick()
                if decode:
                    session.poll()

            session.start()
            blocks.start_block()
            block = blocks.wait_block(tick)
            try:
                session.stop()
                rec = session.recording()
                note = {"samples": len(rec), **rec.notes}
            except Exception as exc:  # the quiet arm may overflow; its GEMM timing still stands
                note = {"error": str(exc)}
    return {"arm": arm, "tflops": round(block["tflops"], 2), "sm_mhz": clocks.take(), "capture": note}


def ab_section(rounds: int, seconds: float, arms: list[str]) -> dict[str, Any]:
    from smlens.profile.cuda import retain_primary_context
    from smlens.profile.cupti_session import resolve_gpu

    gpu = resolve_gpu("0")
    if set(arms) & set(QUIET_ARMS):
        retain_primary_context(gpu.cuda_ordinal)  # CUPTI's profiler needs a context, as Session makes
    clocks = Clocks(gpu.index)
    blocks = Blocks(seconds)
    rates: dict[str, dict[int, float]] = {arm: {} for arm in arms}  # arm: round: TFLOP/s
    mhz: dict[str, list[float]] = {arm: [] for arm in arms}
    notes: list[dict[str, Any]] = []
    for r in range(rounds):
        for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:
            try:
                result = ab_block(arm, blocks, gpu, seconds, clocks)
            except Exception as exc:  # this arm's block is lost; the others go on
                notes.append(say({"section": "ab", "round": r, "arm": arm, "error": str(exc)[-600:]}))
                continue
            say({"section": "ab", "round": r, **result})
            rates[arm][r] = result["tflops"]
            mhz[arm].append(result["sm_mhz"])
            if result["capture"]:
                notes.append({"arm": arm, "round": r, **result["capture"]})
    blocks.close()
    off = rates["off"]
    summary: dict[str, Any] = {}
    for arm, by_round in rates.items():
        v = list(by_round.values())
        paired = [t / off[r] for r, t in by_round.items() if r in off]  # against the off block of its round
        summary[arm] = {
            "tflops": [round(x, 1) for x in v],
            "mean": round(float(np.mean(v)), 2) if v else None,
            "std": round(float(np.std(v, ddof=1)), 2) if len(v) > 1 else None,
            "paired_ratio_mean": round(float(np.mean(paired)), 4) if paired else None,
            "paired_ratio_min_max": [round(min(paired), 4), round(max(paired), 4)] if paired else None,
            "sm_mhz": mhz[arm],
        }
    return say({"section": "ab", "rounds": rounds, "block_s": seconds, **summary, "captures": notes})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = {}
    for name in ("gpu_sm_active_ratio", "gpu_sm_occupancy_ratio", "gpu_utilization_ratio"):
        match = re.search(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M)
        if match:
            found[name] = float(match.group(1))
    return found


def coexist_section(serve_path: str | None) -> dict[str, Any]:
    result: dict[str, Any] = {"section": "coexist"}
    first = subprocess.Popen(
        [*PROFILE, "--seconds", "8", "--out", "/tmp/first.html"],
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    time.sleep(4)
    second = subprocess.run(
        [*PROFILE, "--seconds", "2", "--out", "/tmp/second.html"], capture_output=True, text=True, timeout=120
    )
    out, _ = first.communicate(timeout=120)
    result["second_capture"] = {
        "rc": second.returncode,
        "stderr": second.stderr.strip()[-400:],
        "first_rc": first.returncode,
        "first_stdout": out[-500:],
    }
    say(result["second_capture"])

    ncu = subprocess.Popen(
        [
            "ncu",
            "--clock-control",
            "none",
            "--set",
            "full",
            "--launch-count",
            "40",
            sys.executable,
            "-c",
            NCU_WORKLOAD,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},  # ncu brings its own CUPTI
    )
    time.sleep(8)
    during = subprocess.run(
        [*PROFILE, "--seconds", "3", "--out", "/tmp/ncu.html"], capture_output=True, text=True, timeout=120
    )
    ncu_running = ncu.poll() is None
    try:
        ncu_out, _ = ncu.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        ncu.kill()
        ncu_out, _ = ncu.communicate()
    result["under_ncu"] = {
        "rc": during.returncode,
        "stderr": during.stderr.strip()[-400:],
        "stdout": during.stdout[-300:],
        "ncu_running_at_capture_end": ncu_running,
        "ncu_rc": ncu.returncode,
        "ncu_tail": ncu_out[-1200:],
    }
    say(result["under_ncu"])

    if serve_path:
        port = free_port()
        env = {**os.environ, "PYTHONPATH": f"{serve_path}:{os.environ.get('PYTHONPATH', '')}"}
        serve = subprocess.Popen(
            [sys.executable, "-m", "smlens", "serve", "--listen", f"127.0.0.1:{port}", "--interval", "1"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(6)
        load = Child("gemm-rate", "--seconds", "26")
        load.go()
        scrapes: list[dict[str, Any]] = []
        began = time.monotonic()
        capture: subprocess.Popen[str] | None = None
        while time.monotonic() - began < 24:
            t = round(time.monotonic() - began, 1)
            try:
                scrapes.append({"t": t, **scrape(port)})
            except OSError as exc:
                scrapes.append({"t": t, "error": str(exc)})
            if capture is None and t >= 8:
                capture = subprocess.Popen(
                    [*PROFILE, "--seconds", "8", "--out", "/tmp/serve.html"],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                scrapes[-1]["capture_started"] = True
            time.sleep(1)
        assert capture is not None
        cap_out, cap_err = capture.communicate(timeout=120)
        serve.terminate()
        _, serve_err = serve.communicate(timeout=30)
        result["serve"] = {
            "scrapes": scrapes,
            "capture_rc": capture.returncode,
            "capture_stdout": cap_out[-800:],
            "capture_stderr": cap_err[-300:],
            "serve_rc": serve.returncode,
            "serve_stderr": serve_err[-800:],
            "gemm": load.result(),
        }
        say(result["serve"])
    return result


def example_section(out: Path) -> dict[str, Any]:
    child = Child("schedule", "--reps", "72")
    child.go()
    time.sleep(1)
    run = profile_cli(12, 200, "example", keep=out / "example.txt")
    child.result()
    return say({"section": "example", **run})


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sections", default="ab,coexist,example,long")
    parser.add_argument("--long", default="100,200")
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--arms", default="off,on,on_quiet", help=f"of {', '.join(ARMS)}")
    parser.add_argument("--serve-path", help="PYTHONPATH entry with smlens serve's dependencies")
    args = parser.parse_args()
    arms = args.arms.split(",")
    if unknown := [arm for arm in arms if arm not in ARMS]:
        parser.error(f"unknown arm {unknown[0]!r}: choose among {', '.join(ARMS)}")
    if "off" not in arms:
        parser.error("--arms must include off (every block is compared with the off block of its round)")
    results: dict[str, Any] = {}
    path = args.out / "profile_load.json"
    for name in args.sections.split(","):
        try:
            if name == "long":
                results[name] = long_section([int(x) for x in args.long.split(",")], args.seconds)
            elif name == "ab":
                results[name] = ab_section(args.rounds, 3.0, arms)
            elif name == "coexist":
                results[name] = coexist_section(args.serve_path)
            elif name == "example":
                results[name] = example_section(args.out)
        except Exception as exc:
            import traceback

            results[name] = say({"section": name, "error": traceback.format_exc()[-1500:], "exc": str(exc)})
        path.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
