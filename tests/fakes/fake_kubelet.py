"""A real gRPC server speaking the kubelet's PodResources v1 API on a unix socket, for tests and the bench.

It serves whatever pods the test sets, and can misbehave on request: answer late (``delay``), answer
with bytes that are no PodResources reply (``garbage``), or go away and come back (``stop``/``start``,
which replace the socket file the way a kubelet restart does).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from smlens.attribution import podresources_v1_pb2 as api

GARBAGE = b"\x0a\x05\xff\xff\xff\xff\xff"  # field 1 claims 5 bytes of a message that is not one

# container name -> resource name -> device ids
Containers = Mapping[str, Mapping[str, Sequence[str]]]


def pod(namespace: str, name: str, containers: Containers) -> api.PodResources:
    """A pod whose containers hold the given devices."""
    return api.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            api.ContainerResources(
                name=container,
                devices=[
                    api.ContainerDevices(resource_name=resource, device_ids=list(ids))
                    for resource, ids in held.items()
                ],
            )
            for container, held in containers.items()
        ],
    )


def dra_pod(
    namespace: str, name: str, container: str, driver: str, devices: Iterable[tuple[str, Sequence[str]]]
) -> api.PodResources:
    """A pod with one container holding one resource claim; ``devices`` are (device name, CDI names)."""
    claim = api.DynamicResource(
        claim_name=f"{name}-gpu",
        claim_namespace=namespace,
        claim_resources=[
            api.ClaimResource(
                driver_name=driver,
                pool_name="node-1",
                device_name=device,
                cdi_devices=[api.CDIDevice(name=c) for c in cdi],
            )
            for device, cdi in devices
        ],
    )
    return api.PodResources(
        name=name,
        namespace=namespace,
        containers=[api.ContainerResources(name=container, dynamic_resources=[claim])],
    )


class FakeKubelet:
    """PodResourcesLister on ``socket``. Thread-safe setters; ``calls`` counts List calls."""

    def __init__(self, socket: Path) -> None:
        self.socket = socket
        self._lock = threading.Lock()
        self._pods: list[api.PodResources] = []
        self.delay = 0.0
        self.garbage = False
        self.calls = 0
        self._server: Any = None

    def set_pods(self, pods: Iterable[api.PodResources]) -> None:
        with self._lock:
            self._pods = list(pods)

    def _list(self, request: api.ListPodResourcesRequest, context: Any) -> api.ListPodResourcesResponse:
        with self._lock:
            self.calls += 1
            reply = api.ListPodResourcesResponse(pod_resources=self._pods)
        if self.delay:
            time.sleep(self.delay)
        return reply

    def _get(self, request: api.GetPodResourcesRequest, context: Any) -> api.GetPodResourcesResponse:
        with self._lock:
            for found in self._pods:
                if (found.namespace, found.name) == (request.pod_namespace, request.pod_name):
                    return api.GetPodResourcesResponse(pod_resources=found)
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_namespace}/{request.pod_name} not found")
        raise AssertionError("abort returned")

    def _allocatable(
        self, request: api.AllocatableResourcesRequest, context: Any
    ) -> api.AllocatableResourcesResponse:
        with self._lock:
            devices = [d for p in self._pods for c in p.containers for d in c.devices]
        return api.AllocatableResourcesResponse(devices=devices)

    def _serialize(self, reply: Any) -> bytes:
        return GARBAGE if self.garbage else bytes(reply.SerializeToString())

    def start(self) -> FakeKubelet:
        """Serve on the socket, replacing any file already there (as a restarting kubelet does)."""
        self.socket.unlink(missing_ok=True)
        handler = grpc.method_handlers_generic_handler(
            "v1.PodResourcesLister",
            {
                "List": grpc.unary_unary_rpc_method_handler(
                    self._list, api.ListPodResourcesRequest.FromString, self._serialize
                ),
                "Get": grpc.unary_unary_rpc_method_handler(
                    self._get, api.GetPodResourcesRequest.FromString, self._serialize
                ),
                "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(
                    self._allocatable, api.AllocatableResourcesRequest.FromString, self._serialize
                ),
            },
        )
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4), handlers=[handler])
        server.add_insecure_port(f"unix:{self.socket}")
        server.start()
        self._server = server
        return self

    def stop(self, remove_socket: bool = True) -> None:
        if self._server is not None:
            self._server.stop(grace=None)
            self._server = None
        if remove_socket:
            self.socket.unlink(missing_ok=True)

    def __enter__(self) -> FakeKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main(argv: Sequence[str]) -> None:
    """``python tests/fakes/fake_kubelet.py SOCKET PODS.json``: serve until killed. The JSON file is a
    list of ``{"namespace", "name", "containers": {container: {resource: [device ids]}}}``."""
    import json
    import signal

    socket, pods_file = Path(argv[0]), Path(argv[1])
    stop_signals = {signal.SIGINT, signal.SIGTERM}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)  # before gRPC starts threads: they inherit it
    kubelet = FakeKubelet(socket)
    kubelet.set_pods(
        pod(p["namespace"], p["name"], p["containers"]) for p in json.loads(pods_file.read_text())
    )
    kubelet.start()
    print(f"serving PodResources v1 on {socket}", flush=True)
    signal.sigwait(stop_signals)
    kubelet.stop()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
