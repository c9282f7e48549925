"""Every file smlens reads is bounded: a file without end (/dev/zero) and a YAML alias bomb each get one
short sentence and exit 1, through the CLI as users meet them, in a process whose memory is capped."""

from __future__ import annotations

import gzip
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from smlens.errors import ConfigError
from smlens.files import MAX_ALIAS_NODES, MAX_FILE_BYTES, MAX_QUOTED, quote, read_bounded, read_yaml
from smlens.profile import recording
from smlens.profile.recording import Recording, RecordingError

ADDRESS_SPACE = 2 * 2**30
SERVE = [sys.executable, "-m", "smlens", "serve", "--backend", "sim", "--listen", "127.0.0.1:0"]
FILE_FLAGS = ("--config", "--web-config-file", "--thresholds", "--sim-scenario", "--sim-pods")


def _capped() -> None:
    """In the child: what a pod's memory limit does, so that a file read whole fails fast."""
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def serve_with(flag: str, path: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SERVE, flag, str(path)],
        capture_output=True,
        text=True,
        timeout=15,
        preexec_fn=_capped,
        env={**os.environ, "PYTHONPATH": str(REPO / "exporter")},
    )


def assert_one_short_sentence(done: subprocess.CompletedProcess[str], names: str) -> None:
    assert done.returncode == 1, done.stderr[:2000]
    assert len(done.stderr) < 2000, done.stderr[:2000]
    assert "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("smlens: ") and names in done.stderr, done.stderr


@pytest.mark.parametrize("flag", FILE_FLAGS)
def test_a_file_without_end_gets_one_sentence_that_names_it(flag: str) -> None:
    done = serve_with(flag, "/dev/zero")
    assert_one_short_sentence(done, "/dev/zero")
    assert "larger than 1 MiB" in done.stderr


def _capped_above_a_recording() -> None:
    """In the child: room for the one buffer a recording is read into, and the same cap beyond it."""
    limit = recording.MAX_BYTES + ADDRESS_SPACE
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def test_a_recording_without_end_gets_one_sentence(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "smlens",
            "profile",
            "--from-json",
            "/dev/zero",
            "--out",
            str(tmp_path / "r.html"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_capped_above_a_recording,
        # one BLAS thread: numpy's per-thread buffers would otherwise take address space by the core count
        env={**os.environ, "PYTHONPATH": str(REPO / "exporter"), "OPENBLAS_NUM_THREADS": "1"},
    )
    assert_one_short_sentence(done, "/dev/zero")
    assert "larger than 2048 MiB" in done.stderr
    assert not (tmp_path / "r.html").exists()


def test_a_compressed_recording_is_bounded_once_decompressed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "capture.json.gz"
    with gzip.open(path, "wt") as f:
        f.write(" " * 2000 + "{}")
    monkeypatch.setattr(recording, "MAX_BYTES", 1000)
    with pytest.raises(RecordingError, match=rf"^profile recording {path} holds more than"):
        Recording.load(path)


def billion_laughs() -> str:
    """A flow list of 9 lists, each 9 aliases of the one before: a few hundred bytes, 9**9 strings."""
    levels = ["&a [" + ", ".join(["lol"] * 9) + "]"]
    for previous, anchor in zip("abcdefgh", "bcdefghi", strict=True):
        levels.append(f"&{anchor} [" + ", ".join([f"*{previous}"] * 9) + "]")
    return "[" + ", ".join(levels) + "]"


# Where each file's loader shows or walks the value it refuses.
BOMBS = {
    "--config": "interval: {bomb}\n",
    "--web-config-file": "tls_server_config: {{client_auth_type: {bomb}}}\n",
    "--thresholds": "hollow_sm_active: {bomb}\n",
    "--sim-scenario": "gpus: [{bomb}]\n",
    "--sim-pods": "pods: [{{namespace: ml, pod: p, container: c, gpus: {bomb}}}]\n",
}


@pytest.mark.parametrize("flag", FILE_FLAGS)
def test_an_alias_bomb_gets_one_sentence(flag: str, tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(BOMBS[flag].format(bomb=billion_laughs()))
    assert bomb.stat().st_size < 600
    done = serve_with(flag, bomb)
    assert_one_short_sentence(done, str(bomb))
    assert "aliases" in done.stderr


def test_a_file_at_the_limit_is_read_and_one_byte_more_is_not(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    path.write_bytes(b"#" * MAX_FILE_BYTES)
    assert len(read_bounded(path, "config file")) == MAX_FILE_BYTES
    path.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    with pytest.raises(ConfigError, match=rf"^config file {path} is larger than 1 MiB"):
        read_bounded(path, "config file")


def test_anchors_that_save_typing_still_work(tmp_path: Path) -> None:
    path = tmp_path / "scenario.yaml"
    path.write_text(
        "phase: &busy {profile: healthy, seconds: 5}\n"
        "gpus: [{phases: [*busy, {profile: idle, seconds: 1}]}, {phases: [*busy]}]\n"
        "base: &base {a: 1, b: 2}\n"
        "merged: {<<: *base, c: 3}\n"
    )
    data = read_yaml(path, "scenario file")
    assert data["gpus"][1]["phases"][0] == {"profile": "healthy", "seconds": 5}
    assert data["merged"] == {"a": 1, "b": 2, "c": 3}


def test_aliases_are_refused_past_the_bound_and_when_they_hold_themselves(tmp_path: Path) -> None:
    path = tmp_path / "f.yaml"
    block = "[" + ", ".join(["x"] * 100) + "]"
    uses = MAX_ALIAS_NODES // 100  # each use adds the block's 101 nodes
    path.write_text(f"a: &a {block}\nb: [{', '.join(['*a'] * (uses - 1))}]\n")
    assert len(read_yaml(path, "config file")["b"]) == uses - 1
    path.write_text(f"a: &a {block}\nb: [{', '.join(['*a'] * (uses + 1))}]\n")
    with pytest.raises(ConfigError, match="uses aliases that expand to more than"):
        read_yaml(path, "config file")
    path.write_text("a: &a [1, *a]\n")
    with pytest.raises(ConfigError, match=r"holds an alias that refers to itself\.$"):
        read_yaml(path, "config file")


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("interval: 1\nlog_level: [info\n", 3),  # the flow list runs to the end of the file
        ("interval: 1\n  log_level: info\n", 2),
        ("interval: 1\nhostname: a\x00b\n", 2),  # a character YAML does not allow (PyYAML's ReaderError)
        ("interval: 1\n\nsim_gpus: 2020-13-45\n", 3),  # a date that the calendar does not have
        ("interval: 1\nsim_gpus: " + "1" * 5000 + "\n", 2),  # past Python's digit limit for int()
    ],
    ids=["unclosed list", "bad indent", "NUL", "no such date", "digit limit"],
)
def test_invalid_yaml_names_the_line_in_one_short_sentence(tmp_path: Path, text: str, line: int) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        read_yaml(path, "config file")
    message = str(caught.value)
    assert message.startswith(f"config file {path} is not valid YAML at line {line}: "), message
    assert message.endswith(".") and "\n" not in message and len(message) < 200, message


def test_a_bad_value_is_quoted_in_a_few_dozen_characters() -> None:
    nested = [[["x" * 1000] * 1000] * 1000] * 1000
    for value in ("x" * 10**6, nested, {str(i): i for i in range(10**5)}, 10**5000, 0x1 << 10**6):
        assert len(quote(value)) <= MAX_QUOTED
    assert quote("hollw") == "'hollw'"
