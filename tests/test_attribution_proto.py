"""The committed PodResources stubs are exactly what grpcio-tools makes of the committed .proto."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

from grpc_tools import protoc

from conftest import REPO

PACKAGE = REPO / "exporter" / "smlens" / "attribution"
PROTO = "smlens/attribution/podresources_v1.proto"
GENERATED = ("podresources_v1_pb2.py", "podresources_v1_pb2.pyi", "podresources_v1_pb2_grpc.py")


def test_regenerating_the_stubs_gives_the_committed_files(tmp_path: Path) -> None:
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{REPO / 'exporter'}",
            f"--python_out={tmp_path}",
            f"--pyi_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            str(REPO / "exporter" / PROTO),
        ]
    )
    assert status == 0
    tools = importlib.metadata.version("grpcio-tools")
    for name in GENERATED:
        fresh = (tmp_path / "smlens" / "attribution" / name).read_text()
        assert fresh == (PACKAGE / name).read_text(), (
            f"{name} differs from what grpcio-tools {tools} generates; regenerate it with the command "
            f"at the top of {PROTO} (or install the grpcio-tools version that made it)"
        )


def test_the_service_speaks_the_kubelet_wire_names() -> None:
    from smlens.attribution import podresources_v1_pb2 as api

    service = api.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert {m.name for m in service.methods} == {"List", "Get", "GetAllocatableResources"}
    devices = api.ContainerDevices.DESCRIPTOR.fields_by_name
    assert (devices["resource_name"].number, devices["device_ids"].number) == (1, 2)
    claim = api.ClaimResource.DESCRIPTOR.fields_by_name
    assert {name: claim[name].number for name in ("driver_name", "pool_name", "device_name")} == {
        "driver_name": 2,
        "pool_name": 3,
        "device_name": 4,
    }
    assert api.ContainerResources.DESCRIPTOR.fields_by_name["dynamic_resources"].number == 5
