"""Typed, frozen settings per command, checked whole before anything starts; refusals of bad numbers
and files, each one sentence that names where the value came from."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from conftest import run_cli
from smlens.errors import ConfigError
from smlens.names import MAX_SIM_GPUS
from smlens.settings import CheckSettings, Option, ServeSettings, resolve
from smlens.sources.sim import load_scenario
from smlens.verdicts import thresholds
from smlens.web.admin import read_token


def test_one_typed_frozen_object_per_command_with_defaults_parsed() -> None:
    serve = resolve("serve", {}, environ={})
    check = resolve("check", {}, environ={})
    assert type(serve) is ServeSettings and type(check) is CheckSettings
    assert serve.listen == ("0.0.0.0", 10132)  # the default went through the same parser as a flag
    assert serve.gpu_resource_names == ("nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-*")
    assert (check.duration, check.json) == (3.0, False)
    assert not hasattr(check, "listen") and not hasattr(serve, "duration")
    with pytest.raises(dataclasses.FrozenInstanceError):
        serve.interval = 2.0  # type: ignore[misc]


def test_port_0_means_any_free_port_and_65536_is_refused() -> None:
    assert resolve("serve", {"listen": "127.0.0.1:0"}, environ={}).listen == ("127.0.0.1", 0)
    with pytest.raises(ConfigError, match=r"^--listen: '127.0.0.1:65536' must be HOST:PORT"):
        resolve("serve", {"listen": "127.0.0.1:65536"}, environ={})


def test_check_options_come_from_the_environment_too() -> None:
    check = resolve("check", {}, environ={"SMLENS_DURATION": "10", "SMLENS_JSON": "true"})
    assert (check.duration, check.json) == (10.0, True)
    with pytest.raises(
        ConfigError, match=r"^environment variable SMLENS_JSON: 'maybe' must be true or false\.$"
    ):
        resolve("check", {}, environ={"SMLENS_JSON": "maybe"})


@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "+Infinity", "1e400"])
@pytest.mark.parametrize(
    "name", ["interval", "energy_interval", "utilization_interval", "attribution_interval"]
)
def test_non_finite_numbers_are_refused_from_flags_and_environment(name: str, value: str) -> None:
    flag = "--" + name.replace("_", "-")
    with pytest.raises(
        ConfigError, match=rf"^{flag}: '{value}' must be a finite number\.$".replace("+", r"\+")
    ):
        resolve("serve", {name: value}, environ={})
    env = "SMLENS_" + name.upper()
    with pytest.raises(ConfigError, match=rf"^environment variable {env}: .* must be a finite number\.$"):
        resolve("serve", {}, environ={env: value})


HUGE = "1" + "0" * 400  # beyond float's range: math.isfinite() of it raises OverflowError


@pytest.mark.parametrize("name", ["sim_gpus", "sim_seed", "interval", "duration"])
def test_a_huge_whole_number_is_one_sentence(tmp_path: Path, name: str) -> None:
    flag, env = "--" + name.replace("_", "-"), "SMLENS_" + name.upper()
    config = tmp_path / "c.yaml"
    config.write_text(f"{name}: {HUGE}\n")
    for flags, environ, origin in (
        ({name: HUGE}, {}, flag),
        ({}, {env: HUGE}, f"environment variable {env}"),
        ({"config": str(config)}, {}, f"config file {config} option '{name}'"),
    ):
        try:
            resolve("check", {"backend": "sim", **flags}, environ=environ)
        except ConfigError as exc:
            assert str(exc).startswith(f"{origin}: "), exc
            assert "1000" in str(exc) and "must be" in str(exc), exc
            assert "\n" not in str(exc)


@pytest.mark.parametrize("text", [".nan", ".inf", "-.inf", ".NaN"])
def test_non_finite_numbers_are_refused_from_the_config_file(tmp_path: Path, text: str) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"interval: {text}\n")
    with pytest.raises(
        ConfigError, match=rf"^config file {config} option 'interval': .* must be a finite number\.$"
    ):
        resolve("serve", {"config": str(config)}, environ={})
    config.write_text(f"sim_gpus: {text}\n")
    with pytest.raises(
        ConfigError, match=rf"^config file {config} option 'sim_gpus': .* must be a whole number\.$"
    ):
        resolve("serve", {"config": str(config)}, environ={})


def test_numbers_are_plain_and_text_is_text(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"^--interval: '1_0.5e-1' must be a number\.$"):
        resolve("serve", {"interval": "1_0.5e-1"}, environ={})
    config = tmp_path / "c.yaml"
    config.write_text("hostname: 12345\n")
    with pytest.raises(ConfigError, match=r"'hostname': 12345 must be text \(quote it in YAML\)\.$"):
        resolve("serve", {"config": str(config)}, environ={})


def test_an_option_taking_a_value_names_it_in_help() -> None:
    with pytest.raises(TypeError, match="needs a metavar"):
        Option(name="timeout", parse=float, default=None, help="seconds", group="g")


def test_a_config_option_spelled_twice_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("sim-gpus: 2\nsim_gpus: 3\n")
    with pytest.raises(ConfigError, match=r"option 'sim_gpus' is given twice \(- and _ spell it alike\)\.$"):
        resolve("serve", {"config": str(config)}, environ={})


def test_a_config_key_without_a_value_leaves_the_option_at_its_default(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("interval:\nhostname:\n")
    settings = resolve("serve", {"config": str(config)}, environ={})
    assert (settings.interval, settings.hostname) == (1.0, None)


def test_whole_numbers_are_whole(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("sim_gpus: 2.5\nsim_seed: 3.0\n")
    with pytest.raises(
        ConfigError, match=rf"^config file {config} option 'sim_gpus': 2\.5 must be a whole number\.$"
    ):
        resolve("serve", {"config": str(config)}, environ={})
    config.write_text("backend: sim\nsim_gpus: 2.0\n")
    assert resolve("serve", {"config": str(config)}, environ={}).sim_gpus == 2


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            {"attribution_interval": "2", "attribution_timeout": "3"},
            "must be shorter than --attribution-interval",
        ),
        ({"backend": "nvml", "sim_pods": "pods.yaml"}, "--sim-pods applies only to --backend sim."),
        ({"backend": "sim", "process_attribution": True}, "needs --backend nvml or auto"),
        ({"dcgm_embedded": True, "dcgm_hostengine": "h:5555"}, "exclude each other"),
        ({"backend": "nvml", "admin_token_file": "t"}, "DCGM is not in use here"),
        ({"backend": "sim", "admin_token_file": "t"}, "DCGM is not in use here"),
        ({"backend": "nvml", "sim_scenario": "s.yaml"}, "^--sim-scenario applies only to --backend sim.$"),
        ({"backend": "nvml", "sim_gpus": "4"}, "^--sim-gpus applies only to --backend sim.$"),
        ({"backend": "auto", "sim_seed": "7"}, "^--sim-seed applies only to --backend sim.$"),
        ({"backend": "dcgm", "sim_seed": "0"}, "^--sim-seed applies only to --backend sim.$"),
        (
            {"backend": "sim", "dcgm_embedded": True},
            "^--dcgm-embedded applies only to --backend auto or dcgm.$",
        ),
        ({"backend": "nvml", "dcgm_hostengine": "h"}, "^--dcgm-hostengine applies only to --backend auto or"),
    ],
)
def test_rules_between_values_are_checked_with_the_values(flags: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve("serve", flags, environ={})


def test_sim_options_from_the_environment_or_a_config_file_are_refused_on_other_backends(
    tmp_path: Path,
) -> None:
    """Unset, they are no refusal: the sim backend's node size and seed apply only when it opens."""
    for command in ("serve", "check"):
        settings = resolve(command, {"backend": "nvml"}, environ={})
        assert (settings.sim_gpus, settings.sim_seed) == (None, None)
    with pytest.raises(ConfigError, match=r"^--sim-gpus applies only to --backend sim\.$"):
        resolve("check", {"backend": "nvml"}, environ={"SMLENS_SIM_GPUS": "2"})
    config = tmp_path / "c.yaml"
    config.write_text("backend: auto\nsim_seed: 3\n")
    with pytest.raises(ConfigError, match=r"^--sim-seed applies only to --backend sim\.$"):
        resolve("serve", {"config": str(config)}, environ={})
    assert resolve("serve", {"config": str(config), "backend": "sim"}, environ={}).sim_seed == 3


def test_a_non_utf8_file_is_one_sentence(tmp_path: Path) -> None:
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"interval: 1\n\xff\xfe\x00garbage")
    message = r"is not UTF-8 text \(byte 0xff at offset 12\)\.$"
    with pytest.raises(ConfigError, match=r"^config file .*binary\.yaml " + message):
        resolve("serve", {"config": str(binary)}, environ={})
    with pytest.raises(ConfigError, match=r"^thresholds file .*binary\.yaml " + message):
        thresholds.load(binary)
    with pytest.raises(ConfigError, match=r"^scenario file .*binary\.yaml " + message):
        load_scenario(binary)


def test_a_utf8_byte_order_mark_is_fine(tmp_path: Path) -> None:
    config = tmp_path / "bom.yaml"
    config.write_bytes("\ufeffinterval: 2\n".encode())
    assert resolve("serve", {"config": str(config)}, environ={}).interval == 2.0


@pytest.mark.parametrize(
    "text", ["busy_utilization: .nan\n", "hollow_sm_active: .inf\n", "low_occupancy: -.inf\n"]
)
def test_non_finite_thresholds_are_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"must be a ratio from 0 to 1, got -?(nan|inf)\.$"):
        thresholds.load(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("gpus: [{profile: hollow, sm_active: .nan}]", r"sm_active must be a ratio from 0 to 1, got nan\."),
        (
            "gpus: [{profile: hollow, pcie_bytes_per_second: .inf}]",
            r"must be a non-negative number, got inf\.",
        ),
        (
            "gpus: [{phases: [{profile: idle, seconds: .inf}]}]",
            r"'seconds' must be a positive number, got inf\.",
        ),
        (
            "gpus: [{phases: [{profile: idle, seconds: .nan}]}]",
            r"'seconds' must be a positive number, got nan\.",
        ),
        ("gpus: [{profile: [hollow]}]", r"unknown profile \['hollow'\]"),
        (
            f"gpus: [{{phases: [{{profile: idle, seconds: {HUGE}}}]}}]",
            r"'seconds' must be a positive number, got 1000+\.\.\.0+\.$",
        ),
        (f"gpus: [{{profile: hollow, sm_active: {HUGE}}}]", r"sm_active must be a ratio from 0 to 1"),
        (
            f"gpus: [{{profile: hollow, pcie_bytes_per_second: {HUGE}}}]",
            r"must be a non-negative number, got 1000+\.\.\.0+\.$",
        ),
    ],
)
def test_scenario_numbers_must_be_finite(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_scenario(path)


def test_a_scenario_obeys_the_gpu_cap_of_sim_gpus(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("gpus: [" + ", ".join(["idle"] * MAX_SIM_GPUS) + "]\n")
    assert len(load_scenario(path).gpus) == MAX_SIM_GPUS
    path.write_text("gpus: [" + ", ".join(["idle"] * 5000) + "]\n")
    with pytest.raises(
        ConfigError, match=rf"lists 5000 GPUs; a simulated node has at most {MAX_SIM_GPUS}\.$"
    ):
        load_scenario(path)
    with pytest.raises(ConfigError, match=rf"--sim-gpus: '65' must be from 1 to {MAX_SIM_GPUS}\.$"):
        resolve("serve", {"sim_gpus": "65"}, environ={})


# --- the admin token file --------------------------------------------------------------------------------


def token_file(tmp_path: Path, content: bytes, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_bytes(content)
    path.chmod(mode)
    return path


@pytest.mark.parametrize(
    "content",
    [b"a-long-enough-secret-token", b"a-long-enough-secret-token\n", b" padded-secret-token-0123 \r\n"],
)
def test_token_file_of_one_line(tmp_path: Path, content: bytes) -> None:
    assert read_token(token_file(tmp_path, content)) == content.decode().strip()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"first-line-secret-token\nsecond-line-secret-token\n", "must hold exactly one line, the token"),
        (b"first-line-secret-token\n\n", "must hold exactly one line, the token"),
        (b"short\n", "must be at least 16 characters long"),
        (b"", "must be at least 16 characters long"),
        (b"\xff" * 20, "is not UTF-8 text"),
    ],
)
def test_bad_token_files_are_one_sentence(tmp_path: Path, content: bytes, message: str) -> None:
    path = token_file(tmp_path, content)
    with pytest.raises(ConfigError, match=message) as raised:
        read_token(path)
    assert str(path) in str(raised.value)


@pytest.mark.parametrize(
    ("mode", "warns"), [(0o600, False), (0o400, False), (0o640, True), (0o604, True), (0o644, True)]
)
def test_a_token_file_others_can_read_draws_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int, warns: bool
) -> None:
    path = token_file(tmp_path, b"a-long-enough-secret-token\n", mode)
    with caplog.at_level(logging.WARNING, logger="smlens.web.admin"):
        read_token(path)
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == (
        [f"admin token file {path} is readable by its group or by everyone (mode {mode:03o}); chmod 600 it"]
        if warns
        else []
    )


def test_bad_input_stops_serve_before_the_sampler_starts(tmp_path: Path) -> None:
    two_lines = token_file(tmp_path, b"first-line-secret-token\nsecond-line-secret-token\n")
    scenario = tmp_path / "s.yaml"
    scenario.write_text("gpus: [{profile: hollow, sm_active: .nan}]\n")
    cases = [  # the token file is read before NVML opens, with a backend that can pause
        (["--backend", "auto", "--admin-token-file", str(two_lines)], "must hold exactly one line"),
        (
            ["--backend", "sim", "--sim-scenario", str(scenario)],
            "sm_active must be a ratio from 0 to 1, got nan",
        ),
        (["--backend", "sim", "--interval", "nan"], "--interval: 'nan' must be a finite number."),
    ]
    for args, words in cases:
        result = run_cli("serve", "--listen", "127.0.0.1:1", *args, timeout=30)
        assert result.returncode == 1, (args, result.stderr)
        assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr  # one line
        assert words in result.stderr and result.stderr.startswith("smlens: "), result.stderr
