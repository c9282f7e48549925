from __future__ import annotations

from pathlib import Path

import pytest

from smlens.errors import ConfigError
from smlens.settings import DEFAULT_PORT, resolve


def test_defaults() -> None:
    settings = resolve("serve", {}, environ={})
    assert settings.backend == "auto" and settings.interval == 1.0
    assert settings.listen == ("0.0.0.0", DEFAULT_PORT)
    assert settings.node_name  # falls back to the OS hostname


def test_precedence_is_file_then_environment_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("interval: 2\nsim_gpus: 4\nhostname: from-file\nbackend: sim\n")
    env = {"SMLENS_CONFIG": str(config), "SMLENS_INTERVAL": "3"}
    settings = resolve("serve", {"interval": "5"}, environ=env)
    assert settings.interval == 5.0
    settings = resolve("serve", {}, environ=env)
    assert (settings.interval, settings.sim_gpus, settings.node_name) == (3.0, 4, "from-file")


def test_ipv6_listen_address() -> None:
    assert resolve("serve", {"listen": "[::1]:9999"}, environ={}).listen == ("::1", 9999)


@pytest.mark.parametrize(
    ("flags", "env", "message"),
    [
        ({"interval": "61"}, {}, "--interval: '61' must be from 0.1 to 60.0."),
        ({}, {"SMLENS_SIM_GPUS": "x"}, "environment variable SMLENS_SIM_GPUS: 'x' must be a whole number."),
        ({"listen": "1.2.3.4:70000"}, {}, "--listen: '1.2.3.4:70000' must be HOST:PORT"),
        ({"hostname": "  "}, {}, "must be a non-empty string"),
    ],
)
def test_invalid_values_name_their_origin(flags: dict[str, str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        resolve("serve", flags, environ=env)


def test_config_file_must_be_a_mapping(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        resolve("serve", {"config": str(config)}, environ={})
