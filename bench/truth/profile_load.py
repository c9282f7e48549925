"""What `smlens profile` costs and how it coexists, on a GPU under load.

    PYTHONPATH=exporter python3 -m bench.truth.profile_load --out DIR [--sections ab,coexist,example,long]
        [--long 100,200] [--seconds 60] [--rounds 6] [--arms off,on,on_quiet,on_1ms] [--serve-path DIR]

* ``long``: for each interval (us) of ``--long``, ``smlens profile --seconds S`` (the CLI, in its own process)
  while a bf16 GEMM loop runs in another: samples kept and dropped and why (the capture's notes), overflow,
  the CLI's CPU time (its evaluator process included) and peak RSS, the wall time to the report.
* ``ab``: interleaved blocks of the same GEMMs in one process, timed with CUDA events, one block per arm
  and round (rounds rotate the order): capture off; on at 100 us, decoding as ``smlens profile`` does; on
  at 100 us with no host work during the block (the samples wait in a 2 GiB hardware buffer and are decoded
  after it); on at 1 ms.
* ``coexist``: a second capture during one; a capture while Nsight Compute profiles another process;
  ``smlens serve`` (NVML + GPM) scraped every second before, during and after a capture of a GEMM loop.
* ``example``: the docs' example, a 12 s capture at 200 us of the truth schedule.
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
from pathlib import Path
from typing import Any

import numpy as np
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
    """The gemm-blocks child: ``block()`` runs one block and returns its TFLOP/s."""

    def __init__(self, seconds: float) -> None:
        self.child = Child("gemm-blocks", "--seconds", str(seconds))
        self.started = False

    def start_block(self) -> None:
        if self.started:
            stdin = self.child.process.stdin
            assert stdin is not None
            stdin.write("go\n")
            stdin.flush()
        else:
            self.child.go()
            self.started = True

    def wait_block(self, session: Any = None) -> float:
        stdout = self.child.process.stdout
        assert stdout is not None
        while not select.select([stdout], [], [], 0.05)[0]:
            if session is not None:
                session.poll()
        return float(json.loads(stdout.readline())["tflops"])

    def close(self) -> None:
        stdin = self.child.process.stdin
        assert stdin is not None
        stdin.write("quit\n")
        stdin.flush()
        self.child.process.wait(timeout=60)


ARMS = {  # name: (interval in ns, hardware buffer MiB, decode during the block)
    "off": (0, 0, False),
    "on": (100_000, 256, True),
    "on_quiet": (100_000, 2048, False),
    "on_1ms": (1_000_000, 256, True),
}


def ab_section(rounds: int, seconds: float, arms: list[str]) -> dict[str, Any]:
    from smlens.profile.cupti_session import Session, resolve_gpu

    gpu = resolve_gpu("0")
    blocks = Blocks(seconds)
    rates: dict[str, list[float]] = {arm: [] for arm in arms}
    notes: list[dict[str, Any]] = []
    for r in range(rounds):
        for arm in arms[r % len(arms) :] + arms[: r % len(arms)]:
            interval, mib, decode = ARMS[arm]
            if not interval:
                blocks.start_block()
                rates[arm].append(blocks.wait_block())
                continue
            with Session(gpu, interval, mib * 2**20) as session:
                session.start()
                blocks.start_block()
                rates[arm].append(blocks.wait_block(session if decode else None))
                try:
                    session.stop()
                    rec = session.recording()
                    notes.append({"arm": arm, "samples": len(rec), **rec.notes})
                except Exception as exc:  # the quiet arm may overflow; its GEMM timing still stands
                    notes.append({"arm": arm, "error": str(exc)})
    blocks.close()
    off = np.asarray(rates["off"])
    summary: dict[str, Any] = {}
    for arm, v in rates.items():
        paired = np.asarray(v) / off  # each block against the off block of its round
        summary[arm] = {
            "tflops": [round(x, 1) for x in v],
            "mean": round(float(np.mean(v)), 2),
            "std": round(float(np.std(v, ddof=1)), 2),
            "paired_ratio_mean": round(float(paired.mean()), 4),
            "paired_ratio_min_max": [round(float(paired.min()), 4), round(float(paired.max()), 4)],
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
    results: dict[str, Any] = {}
    path = args.out / "profile_load.json"
    for name in args.sections.split(","):
        try:
            if name == "long":
                results[name] = long_section([int(x) for x in args.long.split(",")], args.seconds)
            elif name == "ab":
                results[name] = ab_section(args.rounds, 3.0, args.arms.split(","))
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
