"""Which attribution sources the serve settings choose, on the nvml backends (with a scripted pynvml)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from smlens.pipeline import attribution as setup
from smlens.settings import resolve
from test_attribution_processes import GPUS, Gpu, fake_nvml


@pytest.fixture(autouse=True)
def nvml(monkeypatch: pytest.MonkeyPatch) -> dict[str, Gpu]:
    gpus = {g.uuid: Gpu() for g in GPUS}
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(gpus))
    return gpus


def test_default_socket_is_used_where_the_kubelet_directory_exists(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pod-resources").mkdir()
    monkeypatch.setattr(setup, "DEFAULT_SOCKET", tmp_path / "pod-resources" / "kubelet.sock")
    refresher = setup.build_refresher(resolve("serve", {"backend": "nvml"}, {}), GPUS)
    assert refresher is not None
    try:
        states = refresher.refresh().sources
        assert [(s.name, s.up, s.reason) for s in states] == [("podresources", False, "socket_missing")]
    finally:
        refresher.close()


def test_no_kubelet_and_no_process_attribution_means_no_refresher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(setup, "DEFAULT_SOCKET", tmp_path / "absent" / "kubelet.sock")
    assert setup.build_refresher(resolve("serve", {"backend": "auto"}, {}), GPUS) is None


def test_process_attribution_on_nvml(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, nvml: dict[str, Gpu]
) -> None:
    monkeypatch.setattr(setup, "DEFAULT_SOCKET", tmp_path / "absent" / "kubelet.sock")
    settings = resolve(
        "serve", {"backend": "nvml", "process_attribution": True}, {"SMLENS_NO_WORKLOAD_LABELS": "1"}
    )
    refresher = setup.build_refresher(settings, GPUS)
    assert refresher is not None
    try:
        got = refresher.refresh()
        assert [(s.name, s.up) for s in got.sources] == [("processes", True)]
        assert got.owner_labels is False  # from the environment variable
    finally:
        refresher.close()
