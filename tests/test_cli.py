"""The shipped CLI, end to end: real processes, real HTTP on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import REPO, ExporterFactory, free_port, require_tool, run_cli
from smlens import __version__

OWNER_LABELS = {"namespace", "pod", "container"}


def scrape(base: str) -> tuple[float, dict[tuple[str, str], float]]:
    text = httpx.get(base + "/metrics", timeout=5).text
    values: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            # Per-GPU series; the sim pod layout adds namespace/pod/container to most of them.
            if "gpu" in sample.labels and set(sample.labels) - OWNER_LABELS == {"gpu", "uuid", "hostname"}:
                values[(sample.name, sample.labels["gpu"])] = sample.value
            elif not sample.labels:
                values[(sample.name, "")] = sample.value
    return values[("smlens_snapshot_timestamp_seconds", "")], values


def test_serve_sim_counters_grow_at_the_rate_of_the_gauges(start_exporter: ExporterFactory) -> None:
    base = start_exporter("--backend", "sim", "--interval", "0.2", "--hostname", "node-7")
    t1, first = scrape(base)
    time.sleep(2.0)
    t2, second = scrape(base)
    elapsed = t2 - t1
    assert elapsed > 1.5
    for gpu in map(str, range(8)):
        covered = second[("gpu_profiled_seconds_total", gpu)] - first[("gpu_profiled_seconds_total", gpu)]
        assert abs(covered - elapsed) < 0.05, (gpu, covered, elapsed)
        active = second[("gpu_sm_active_seconds_total", gpu)] - first[("gpu_sm_active_seconds_total", gpu)]
        gauge = second[("gpu_sm_active_ratio", gpu)]
        assert abs(active / covered - gauge) <= 0.021, (gpu, active / covered, gauge)  # noise is +/-0.02
    assert second[("gpu_sm_active_ratio", "2")] < 0.01 and second[("gpu_utilization_ratio", "2")] > 0.95
    text = httpx.get(base + "/metrics").text
    assert 'hostname="node-7"' in text


def test_served_output_passes_promtool(start_exporter: ExporterFactory) -> None:
    promtool = require_tool("promtool")
    base = start_exporter("--backend", "sim", "--interval", "0.5")
    body = httpx.get(base + "/metrics").content
    result = subprocess.run([promtool, "check", "metrics"], input=body, capture_output=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr


def test_settings_from_environment_and_config_file(start_exporter: ExporterFactory, tmp_path: Path) -> None:
    config = tmp_path / "smlens.yaml"
    config.write_text("backend: sim\nsim-gpus: 3\ninterval: 0.5\n")
    base = start_exporter("--config", str(config), env={"SMLENS_HOSTNAME": "from-env"})
    gpus = httpx.get(base + "/api/v1/gpus").json()
    assert gpus["hostname"] == "from-env" and len(gpus["gpus"]) == 3
    assert gpus["interval_seconds"] == 0.5


def test_check_prints_a_verdict_per_gpu() -> None:
    result = run_cli("check", "--backend", "sim", "--duration", "1", "--interval", "0.2")
    assert result.returncode == 3, result.stderr  # the sim node has hollow GPUs
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["GPU", "model", "util"]
    assert "busy but SMs mostly idle" in lines[2]  # GPU 1, hollow
    assert "busy but SMs mostly idle" in lines[3]  # GPU 2, one SM
    assert "compute-bound: the tensor pipe" in lines[1] and "stalled" in lines[4]
    assert "idle, memory held" in lines[8]
    as_json = run_cli("check", "--backend", "sim", "--duration", "1", "--interval", "0.2", "--json")
    payload = json.loads(as_json.stdout)
    assert [g["verdict"]["code"] for g in payload["gpus"]][:4] == [
        "compute_bound",
        "hollow",
        "hollow",
        "stalled",
    ]
    assert payload["gpus"][0]["verdict"]["pipe"] == "tensor"
    assert payload["gpus"][0]["means"]["compute_sol"] >= 0.9
    assert abs(payload["gpus"][2]["means"]["sm_active"] - 1 / 132) < 0.002


def test_check_says_what_it_samples_and_logs_only_warnings() -> None:
    result = run_cli("check", "--backend", "sim", "--sim-gpus", "3", "--duration", "1", "--interval", "0.2")
    assert result.stderr.splitlines() == [
        "smlens check: sampling 3 GPU(s) (sim) for 1 s ...",
        "smlens check: exit 3: --fail-on hollow matched GPU 1 (hollow), GPU 2 (hollow).",
    ]
    verbose = run_cli("check", "--backend", "sim", "--duration", "0.5", "--log-level", "info")
    assert " INFO smlens.pipeline.profiling_policy: GPU 0 " in verbose.stderr
    assert verbose.stderr.splitlines()[-2].startswith("smlens check: sampling 8 GPU(s)")


@pytest.mark.parametrize(
    ("fail_on", "code"),
    [
        (None, 3),  # default: hollow; GPUs 1 and 2 of the sim node are hollow
        ("none", 0),
        ("memory_bound", 3),  # GPU 4
        ("stalled,partial", 3),
        ("compute_bound", 3),  # GPU 0
        ("no_profiling,down,unknown", 0),
    ],
)
def test_check_exit_code_gates_on_verdicts(fail_on: str | None, code: int) -> None:
    args = ["check", "--backend", "sim", "--duration", "0.5", "--interval", "0.25", "--json"]
    result = run_cli(*args, *(["--fail-on", fail_on] if fail_on else []))
    assert result.returncode == code, result.stderr
    verdicts = [g["verdict"]["code"] for g in json.loads(result.stdout)["gpus"]]
    wanted = {"hollow"} if fail_on is None else set(fail_on.split(",")) - {"none"}
    assert bool(wanted & set(verdicts)) == (code == 3), verdicts
    # Exit 3 says why, in one line on stderr: every GPU whose verdict matched, and the verdict.
    why = [line for line in result.stderr.splitlines() if line.startswith("smlens check: exit 3: ")]
    matched = ", ".join(f"GPU {i} ({v})" for i, v in enumerate(verdicts) if v in wanted)
    assert why == (
        [f"smlens check: exit 3: --fail-on {','.join(sorted(wanted))} matched {matched}."]
        if code == 3
        else []
    )


MIG_NODE = (
    "gpus:\n  - healthy\n"
    "  - mig: [{mig_profile: 3g.71gb, profile: healthy}, {mig_profile: 1g.18gb, profile: hollow},"
    " {mig_profile: 1g.18gb, profile: idle}]\n"
)


def test_check_judges_each_mig_instance_and_fails_on_a_hollow_one(tmp_path: Path) -> None:
    """A hollow 1g slice fails `--fail-on hollow`, named, even though its GPU as a whole is not hollow."""
    scenario = tmp_path / "mig.yaml"
    scenario.write_text(MIG_NODE)
    args = [
        "check",
        "--backend",
        "sim",
        "--sim-scenario",
        str(scenario),
        "--duration",
        "1",
        "--interval",
        "0.2",
    ]
    result = run_cli(*args)
    assert result.returncode == 3, result.stderr
    assert result.stderr.splitlines()[-1] == (
        "smlens check: exit 3: --fail-on hollow matched GPU 1 MIG instance 2 1g.18gb (hollow)."
    )
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert list(rows) == ["0", "1", "1/1", "1/2", "1/3"]
    assert "MIG 3g.71gb" in rows["1/1"] and "compute-bound" in rows["1/1"]
    assert "MIG 1g.18gb" in rows["1/2"] and "held but SMs mostly idle" in rows["1/2"]
    assert "idle (no kernels ran)" in rows["1/3"]
    assert rows["1/2"].split()[3] == "n/a"  # no utilization per MIG instance, never 0
    payload = json.loads(run_cli(*args, "--json", "--fail-on", "none").stdout)
    whole, split = payload["gpus"]
    assert whole["instances"] == []
    instances = split["instances"]
    assert [(i["gpu_instance"], i["mig_profile"], i["verdict"]["code"]) for i in instances] == [
        (1, "3g.71gb", "compute_bound"),
        (2, "1g.18gb", "hollow"),
        (3, "1g.18gb", "idle"),
    ]
    assert 0.05 <= instances[1]["means"]["sm_active"] <= 0.15 and instances[1]["means"]["utilization"] is None
    assert instances[1]["memory_used_bytes"] > 2**30 and instances[2]["memory_used_bytes"] == 0
    idle = run_cli(*args, "--fail-on", "idle")
    assert idle.returncode == 3
    assert idle.stderr.splitlines()[-1].endswith("matched GPU 1 MIG instance 3 1g.18gb (idle).")


def test_check_fail_on_and_log_level_come_from_the_environment_too() -> None:
    env = {"SMLENS_FAIL_ON": "none", "SMLENS_LOG_LEVEL": "info"}
    result = run_cli("check", "--backend", "sim", "--duration", "0.5", env=env)
    assert result.returncode == 0 and " INFO smlens." in result.stderr


def test_check_without_failing_verdicts_exits_0() -> None:
    result = run_cli("check", "--backend", "sim", "--sim-gpus", "1", "--duration", "0.5")  # GPU 0: a GEMM
    assert result.returncode == 0, result.stderr
    assert "compute-bound" in result.stdout


def test_auto_backend_without_nvml_fails_with_one_sentence() -> None:
    result = run_cli("check", "--duration", "1")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "NVML" in lines[0] and "--backend sim" in lines[0] and "Traceback" not in result.stderr


def test_bad_flags_and_files_get_one_line_and_nonzero_exit(tmp_path: Path) -> None:
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("interval: [1, 2")
    unknown = tmp_path / "unknown.yaml"
    unknown.write_text("colour: red\n")
    too_fast = tmp_path / "too-fast.yaml"
    too_fast.write_text("backend: sim\ninterval: 0\n")
    cases = [
        (("serve", "--interval", "0"), 1, "--interval: '0' must be from 0.1 to 60.0"),
        (("serve", "--interval", "fast"), 1, "must be a number"),
        (("serve", "--backend", "cuda"), 1, "must be one of auto, nvml, dcgm, sim"),
        (("serve", "--listen", "nowhere"), 1, "must be HOST:PORT"),
        (("serve", "--frobnicate"), 2, "unrecognized arguments: --frobnicate"),
        (("serve", "--config", str(bad_yaml)), 1, f"config file {bad_yaml} is not valid YAML at line 1: "),
        (
            ("serve", "--config", str(too_fast)),
            1,
            f"config file {too_fast} option 'interval': 0 must be from",
        ),
        (("serve", "--config", str(unknown)), 1, "unknown option 'colour'"),
        (("serve", "--config", str(tmp_path / "absent.yaml")), 1, "cannot read config file"),
        (("check", "--backend", "sim", "--duration", "0"), 1, "--duration: '0' must be from 0.5 to 600"),
        (("check", "--backend", "sim", "--fail-on", "hollw"), 1, "--fail-on: 'hollw' must be a comma list"),
        (("check", "--backend", "sim", "--fail-on", ","), 1, "--fail-on: ',' must be a comma list"),
        (("serve", "--backend", "sim", "--thresholds", str(unknown)), 1, "unknown threshold 'colour'"),
    ]
    for args, code, message in cases:
        result = run_cli(*args)
        assert result.returncode == code, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)


def test_version() -> None:
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout == f"smlens {__version__}\n"


def test_admin_token_needs_dcgm_and_a_readable_file(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("a-long-enough-secret-token\n")
    result = run_cli(
        "serve", "--backend", "sim", "--listen", f"127.0.0.1:{free_port()}", "--admin-token-file", str(token)
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "smlens: --admin-token-file enables DCGM profiling pause/resume, but DCGM is not in use here."
    )
    result = run_cli("serve", "--backend", "auto", "--admin-token-file", str(tmp_path / "absent"))
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        == f"smlens: cannot read admin token file {tmp_path / 'absent'}: No such file or directory."
    )


def test_help_shows_each_default_once_its_env_name_and_choices_and_fits_a_terminal() -> None:
    from smlens.settings import options

    for command in ("serve", "check"):
        wide = run_cli(command, "--help", env={"COLUMNS": "200"})
        assert wide.returncode == 0, wide.stderr
        lines = wide.stdout.splitlines()
        assert max(map(len, lines)) <= 100, max(lines, key=len)
        assert all(
            len(line) <= 80 for line in run_cli(command, "--help", env={"COLUMNS": "80"}).stdout.splitlines()
        )
        text = " ".join(wide.stdout.split())  # undo the wrapping
        for artifact in ("default None", "(default ('", "default: None"):
            assert artifact not in text, (command, artifact)
        for option in options(command):
            entry = text[text.index(option.flag + " ") :]
            entry = entry[: entry.index(f"env {option.env})") + len(option.env) + 5]
            assert entry.count("default") <= 1, entry
            if option.choices:
                assert entry.startswith(f"{option.flag} {{{','.join(option.choices)}}}"), entry
        assert "SMLENS_CONFIG" in text
    check = " ".join(run_cli("check", "--help").stdout.split())
    assert "--duration S seconds to sample, 0.5-600 (default 3; env SMLENS_DURATION)" in check
    assert "--json print JSON instead of a table (env SMLENS_JSON)" in check
    serve = " ".join(run_cli("serve", "--help", env={"COLUMNS": "200"}).stdout.split())
    assert "--backend {auto,nvml,dcgm,sim}" in serve and "(default auto; env SMLENS_BACKEND)" in serve
    assert "(default 0.0.0.0:10132; env SMLENS_LISTEN)" in serve
    assert len(run_cli("serve", "--help", env={"COLUMNS": "100"}).stdout.splitlines()) <= 80  # 29 options


def test_a_reader_that_leaves_early_gets_no_traceback() -> None:
    """`smlens check --json | head -c 10`: the broken pipe ends smlens quietly."""
    command = [
        sys.executable,
        "-m",
        "smlens",
        "check",
        "--backend",
        "sim",
        "--duration",
        "0.5",
        "--json",
        "--log-level",
        "warning",
    ]
    # Buffered stdout, as on a machine without PYTHONUNBUFFERED: the write fails only at the flush.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    env["PYTHONPATH"] = str(REPO / "exporter")
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as process:
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()  # before smlens prints: its write meets a closed pipe
        stderr = process.stderr.read().decode()
        assert process.wait(timeout=60) == 141, stderr
    # The progress line and (the write failing only at the flush) why it would have exited 3; no traceback.
    lines = stderr.splitlines()
    assert lines[0] == "smlens check: sampling 8 GPU(s) (sim) for 0.5 s ...", stderr
    assert all(line.startswith("smlens check: ") for line in lines) and len(lines) <= 2, stderr
