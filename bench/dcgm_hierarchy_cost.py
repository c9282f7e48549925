"""Benchmark: the Python cost of mapping DCGM's MIG hierarchy each tick
(smlens.sources.dcgm.mig.gi_entities), against one dcgmEntityGetLatestValues of the four per-instance
fields, with DCGM's Python bindings over the stub libdcgm of the tests (tests/fakes/dcgm_hostengine.py): a
node of --gpus A100s in MIG mode, 7 one-slice GPU instances with one compute instance each (14 rows a GPU,
112 for 8 GPUs).

    python3 bench/dcgm_hierarchy_cost.py [--bindings DIR] [--gpus 8] [--rounds 200]

DIR holds NVIDIA's dcgm_agent.py, dcgm_structs.py, dcgm_fields.py and dcgmvalue.py (`bash
scripts/fetch-dcgm-bindings.sh --cached` prints where); the default is smlens' double. Only the Python side
is measured: no socket, no hostengine (the stub fills the structure in Python, so the call itself is not
timed). ``getattr`` parses the same structure through the bindings' own attribute access, which NVIDIA's
``_DcgmStructure`` overrides. Times are the thread's CPU time, best of 5 runs, so that a busy machine does
not change the figures.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


def best(call: Callable[[], Any], rounds: int) -> float:
    """Seconds of thread CPU time per call, the best of 5 runs of ``rounds`` calls."""
    runs = []
    for _ in range(5):
        started = time.thread_time()
        for _ in range(rounds):
            call()
        runs.append((time.thread_time() - started) / rounds)
    return min(runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bindings", type=Path, default=REPO / "tests" / "fakes" / "fake_dcgm")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args(argv)
    if not (args.bindings / "dcgm_structs.py").is_file():
        print(f"{args.bindings} holds no dcgm_structs.py.", file=sys.stderr)
        return 2
    sys.path[:0] = [str(REPO / "exporter"), str(REPO / "tests"), str(args.bindings)]
    import dcgm_agent
    import dcgm_fields
    import dcgm_structs

    from fakes import dcgm_hostengine as stub
    from smlens.sources.dcgm import mig as dcgm_mig

    dcgm_structs.dcgmLib = stub.LIBDCGM  # where libdcgm.so would be loaded
    stub.reset()
    gpus = [
        stub.FakeGpu(
            f"GPU-{i:08x}-0000-0000-0000-000000000000",
            instances=[stub.FakeGpuInstance(gi) for gi in range(7)],
        )
        for i in range(args.gpus)
    ]
    stub.REGISTRY.listen(stub.FakeHostengine(gpus))
    dcgm_structs._dcgmInit()
    dcgm_agent.dcgmInit()
    params = dcgm_structs.c_dcgmConnectV2Params_v2()
    params.version = dcgm_structs.c_dcgmConnectV2Params_version2
    handle = dcgm_agent.dcgmConnect_v2("localhost:5555", params)
    hierarchy = dcgm_agent.dcgmGetGpuInstanceHierarchy(handle)
    fields = [1002, 1003, 1004, 1005]

    parse = best(lambda: dcgm_mig.gi_entities(hierarchy, dcgm_fields), args.rounds)
    own_read = dcgm_mig._read
    dcgm_mig._read = getattr  # type: ignore[assignment]
    try:
        through_getattr = best(lambda: dcgm_mig.gi_entities(hierarchy, dcgm_fields), args.rounds)
    finally:
        dcgm_mig._read = own_read
    latest = best(
        lambda: dcgm_agent.dcgmEntityGetLatestValues(handle, dcgm_fields.DCGM_FE_GPU_I, 0, fields),
        args.rounds,
    )
    rows = int(hierarchy.count)
    print(f"bindings {args.bindings}, {args.gpus} GPUs, {rows} hierarchy rows")
    print(f"gi_entities               {parse * 1e6:8.1f} us  ({parse / latest:.1f}x one latest-values call)")
    ratio = through_getattr / parse
    print(f"gi_entities via getattr   {through_getattr * 1e6:8.1f} us  ({ratio:.1f}x gi_entities)")
    print(f"dcgmEntityGetLatestValues {latest * 1e6:8.1f} us  (4 fields, Python side and stub)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
