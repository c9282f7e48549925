"""Who holds which GPU, from the kubelet's PodResources v1 API on its unix socket.

A fresh channel is opened for every refresh: a kubelet restart replaces the socket file, and a new
connection is the simplest way never to talk to the old one. The call is bounded by a deadline.
"""

from __future__ import annotations

import fnmatch
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path

import grpc  # type: ignore[import-untyped]  # grpcio ships no type hints

from smlens.attribution import podresources_v1_pb2 as api
from smlens.attribution import podresources_v1_pb2_grpc as api_grpc
from smlens.attribution.devices import DEFAULT_DRA_DRIVERS, DEFAULT_RESOURCE_NAMES, DeviceMap, Placement
from smlens.attribution.refresher import PODRESOURCES
from smlens.errors import BackendError
from smlens.model import Allocation, Workload

# The kubelet sends up to 16 MiB; gRPC's client default of 4 MiB is too small for busy nodes.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

# gRPC logs a traceback for every reply it cannot decode; the refresher logs one line per change instead.
logging.getLogger("grpc._common").setLevel(logging.CRITICAL)

_REASONS = {
    grpc.StatusCode.DEADLINE_EXCEEDED: ("timeout", "did not answer within {timeout:g} s"),
    grpc.StatusCode.UNAVAILABLE: ("unavailable", "is not accepting connections ({detail})"),
    grpc.StatusCode.UNIMPLEMENTED: ("unimplemented", "does not serve PodResources v1 List ({detail})"),
    grpc.StatusCode.INTERNAL: ("bad_reply", "sent a reply that is not a PodResources v1 answer ({detail})"),
    grpc.StatusCode.PERMISSION_DENIED: ("permission_denied", "refused the call ({detail})"),
}


class PodResourcesClient:
    """Calls ``List`` on the kubelet socket; every failure becomes one :class:`BackendError`."""

    def __init__(self, socket: Path, timeout: float) -> None:
        self.socket = socket
        self.timeout = timeout

    def _fail(self, reason: str, what: str) -> BackendError:
        return BackendError(f"the kubelet PodResources socket {self.socket} {what}.", reason)

    def _check_socket(self) -> None:
        try:
            os.stat(self.socket)
        except FileNotFoundError:
            raise self._fail("socket_missing", "does not exist") from None
        except PermissionError:
            raise self._fail("permission_denied", "cannot be reached: permission denied") from None
        if not os.access(self.socket, os.R_OK | os.W_OK):
            raise self._fail("permission_denied", "is not readable and writable by this user")

    def list(self) -> api.ListPodResourcesResponse:
        self._check_socket()
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
        with grpc.insecure_channel(f"unix:{os.path.abspath(self.socket)}", options=options) as channel:
            stub = api_grpc.PodResourcesListerStub(channel)  # type: ignore[no-untyped-call]  # generated
            try:
                response: api.ListPodResourcesResponse = stub.List(
                    api.ListPodResourcesRequest(), timeout=self.timeout
                )
            except grpc.RpcError as exc:
                code, detail = exc.code(), exc.details() or "no detail"
                if "permission denied" in detail.lower():
                    raise self._fail("permission_denied", "cannot be reached: permission denied") from None
                reason, what = _REASONS.get(code, ("error", f"failed with {code.name} ({{detail}})"))
                raise self._fail(reason, what.format(timeout=self.timeout, detail=detail)) from None
        return response


def _matches(name: str, patterns: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


def allocations(
    response: api.ListPodResourcesResponse,
    devices: DeviceMap,
    resource_names: Sequence[str] = DEFAULT_RESOURCE_NAMES,
    dra_drivers: Sequence[str] = DEFAULT_DRA_DRIVERS,
) -> tuple[Allocation, ...]:
    """The GPU devices of every container in a List reply, mapped to this node's GPUs."""

    def entries() -> Iterator[tuple[Workload, str, str, Placement]]:
        for pod in response.pod_resources:
            for container in pod.containers:
                owner = Workload(pod.namespace, pod.name, container.name)
                for held in container.devices:
                    if _matches(held.resource_name, resource_names):
                        for device_id in held.device_ids:
                            yield owner, held.resource_name, device_id, devices.plugin_device(device_id)
                for claim in container.dynamic_resources:
                    for resource in claim.claim_resources:
                        if _matches(resource.driver_name, dra_drivers):
                            cdi = [d.name for d in resource.cdi_devices]
                            device = resource.device_name or ",".join(cdi)
                            placement = devices.dra_device(resource.device_name, cdi)
                            yield owner, resource.driver_name, device, placement

    unique = dict.fromkeys(
        Allocation(owner, resource, device, placement.gpu_uuid, placement.partition, placement.gpu_instance)
        for owner, resource, device, placement in entries()
    )
    return tuple(unique)


class PodResourcesSource:
    """Allocation source backed by the kubelet. ``mig_devices`` is asked on every refresh."""

    name = PODRESOURCES

    def __init__(
        self,
        client: PodResourcesClient,
        devices: DeviceMap,
        resource_names: Sequence[str] = DEFAULT_RESOURCE_NAMES,
        dra_drivers: Sequence[str] = DEFAULT_DRA_DRIVERS,
        mig_devices: Callable[[], Mapping[str, tuple[str, int]]] | None = None,
    ) -> None:
        self._client = client
        self._devices = devices
        self._resource_names = tuple(resource_names)
        self._dra_drivers = tuple(dra_drivers)
        self._mig_devices = mig_devices

    def allocations(self) -> tuple[Allocation, ...]:
        response = self._client.list()
        devices = self._devices
        if self._mig_devices is not None:
            devices = DeviceMap(devices.gpus, self._mig_devices())
        return allocations(response, devices, self._resource_names, self._dra_drivers)
