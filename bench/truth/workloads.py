"""Controlled GPU workloads, each run in steps of about 0.1 s on a background thread.

A workload's ``step()`` does one batch of work, waits for the GPU to finish it, and returns how much it
did in its unit (bytes moved, floating-point operations, or nothing), so the harness can compare what
the workload achieved over a window with what smlens saw. Needs CuPy and PyTorch (GPU hosts only).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from bench.truth.expect import DeviceLimits, Spin, spin_shapes

SPIN_KERNEL = "smlens_truth_spin"
# Spins on the global nanosecond timer, so a launch lasts the same whatever the SM clock.
_SPIN_SOURCE = r"""
extern "C" __global__ void smlens_truth_spin(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""
STEP_SECONDS = 0.1


class Workload:
    """Idle: no kernel at all. The base of the others."""

    name = "idle"
    description = "no kernel"
    unit = ""  # what step() counts: "bytes", "flop" or nothing

    def prepare(self) -> None:
        """Allocate, compile and warm up; runs before the window."""

    def step(self) -> float:
        time.sleep(STEP_SECONDS)
        return 0.0

    def release(self) -> None:
        """Free what prepare() took."""


class SpinWorkload(Workload):
    def __init__(self, name: str, shape: Spin, limits: DeviceLimits) -> None:
        self.name = name
        self.shape = shape
        self.description = (
            f"spin kernel, {shape.blocks} block(s) x {shape.threads} threads, "
            f"{shape.blocks_per_sm} per SM on {shape.sms} SM(s)"
        )
        self._limits = limits
        self._kernel: Any = None

    def prepare(self) -> None:
        self.launch(int(STEP_SECONDS * 1e8))  # 10 ms, after compiling and loading the kernel

    def launch(self, nanoseconds: int) -> None:
        """One launch that spins for ``nanoseconds``; waits for it."""
        import cupy  # type: ignore[import-not-found,unused-ignore]

        if self._kernel is None:
            self._kernel = spin_kernel(self.shape, self._limits)
        self._kernel(
            (self.shape.blocks,),
            (self.shape.threads,),
            (cupy.uint64(nanoseconds),),
            shared_mem=self.shape.shared_bytes(self._limits),
        )
        cupy.cuda.Device().synchronize()

    def step(self) -> float:
        self.launch(int(STEP_SECONDS * 1e9))
        return 0.0


def spin_kernel(shape: Spin, limits: DeviceLimits) -> Any:
    """The compiled spin kernel, set up for ``shape``; raises if the device would place it otherwise."""
    import cupy  # type: ignore[import-not-found,unused-ignore]

    kernel = cupy.RawKernel(_SPIN_SOURCE, SPIN_KERNEL)
    shared = shape.shared_bytes(limits)
    if shared > limits.max_shared_per_block_optin:
        raise RuntimeError(f"{shared} bytes of shared memory per block exceed the device's opt-in limit.")
    kernel.max_dynamic_shared_size_bytes = shared
    resident = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
        kernel.kernel.ptr, shape.threads, shared
    )
    if resident != shape.blocks_per_sm:
        raise RuntimeError(
            f"the occupancy API allows {resident} blocks of {shape.threads} threads per SM, "
            f"the launch needs exactly {shape.blocks_per_sm}."
        )
    return kernel


class TorchWorkload(Workload):
    """A PyTorch operation repeated ``repeat`` times per step."""

    def __init__(self, name: str, description: str, unit: str, repeat: int) -> None:
        self.name, self.description, self.unit, self.repeat = name, description, unit, repeat
        self._tensors: list[Any] = []

    def operate(self) -> float:
        raise NotImplementedError

    def make(self) -> list[Any]:
        raise NotImplementedError

    def prepare(self) -> None:
        self._tensors = self.make()
        self.step()

    def step(self) -> float:
        import torch  # type: ignore[import-not-found,unused-ignore]

        done = sum(self.operate() for _ in range(self.repeat))
        torch.cuda.synchronize()
        return done

    def release(self) -> None:
        import torch  # type: ignore[import-not-found,unused-ignore]

        self._tensors.clear()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


class Gemm(TorchWorkload):
    def __init__(self, name: str, size: int, repeat: int, description: str) -> None:
        super().__init__(name, description, "flop", repeat)
        self.size = size

    def make(self) -> list[Any]:
        import torch  # type: ignore[import-not-found,unused-ignore]

        a, b = (torch.randn(self.size, self.size, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        return [a, b, torch.empty_like(a)]

    def operate(self) -> float:
        import torch  # type: ignore[import-not-found,unused-ignore]

        a, b, c = self._tensors
        torch.matmul(a, b, out=c)
        return 2.0 * self.size**3


class Copy(TorchWorkload):
    def __init__(self, size: int) -> None:
        super().__init__("copy_d2d", f"device-to-device copy of {size / 2**30:.1f} GiB", "bytes", repeat=40)
        self.size = size

    def make(self) -> list[Any]:
        import torch  # type: ignore[import-not-found,unused-ignore]

        source = torch.randint(0, 255, (self.size,), device="cuda", dtype=torch.uint8)
        return [source, torch.empty_like(source)]

    def operate(self) -> float:
        source, target = self._tensors
        target.copy_(source)
        return 2.0 * self.size  # read once, written once


class Softmax(TorchWorkload):
    def __init__(self, rows: int, columns: int) -> None:
        super().__init__(
            "softmax_fp32", f"fp32 softmax over rows of a {rows} x {columns} matrix", "bytes", repeat=40
        )
        self.shape = (rows, columns)

    def make(self) -> list[Any]:
        import torch  # type: ignore[import-not-found,unused-ignore]

        return [torch.randn(*self.shape, device="cuda", dtype=torch.float32)]

    def operate(self) -> float:
        import torch  # type: ignore[import-not-found,unused-ignore]

        (matrix,) = self._tensors
        torch.softmax(matrix, dim=-1)
        return 2 * 4.0 * float(matrix.numel())  # 4-byte elements read once and written once, at least


def make_workloads(limits: DeviceLimits) -> list[Workload]:
    """All workloads, in the order the harness runs them. Memory workloads are >= 16x the L2."""
    big = max(2**31, 16 * limits.l2_bytes)
    columns = 16384
    spins: list[Workload] = [SpinWorkload(n, shape, limits) for n, shape in spin_shapes(limits).items()]
    return [
        Workload(),
        *spins,
        Gemm("gemm_bf16", 8192, 64, "bf16 GEMM 8192 x 8192 x 8192, back to back"),
        Gemm("gemm_tiny_launch_bound", 256, 2000, "bf16 GEMM 256 x 256 x 256, a stream of launches"),
        Copy(big),
        Softmax(max(16384, big // 2 // (4 * columns)), columns),
    ]


@dataclass(frozen=True)
class Progress:
    at: float  # monotonic time of the last finished step
    done: float  # units done by then


class Running:
    """A workload stepping on a daemon thread until stopped."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self._lock = threading.Lock()
        self._progress = Progress(time.monotonic(), 0.0)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, name=f"truth-{workload.name}", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                units = self.workload.step()
                with self._lock:
                    self._progress = Progress(time.monotonic(), self._progress.done + units)
        except BaseException as exc:  # surfaced by stop()
            self._error = exc

    def progress(self) -> Progress:
        with self._lock:
            return self._progress

    def failed(self) -> BaseException | None:
        return self._error

    def stop(self) -> None:
        """Stop after the current step; re-raises what the thread raised."""
        self._stop.set()
        self._thread.join(timeout=60)
        if self._error is not None:
            raise self._error


def rate(first: Progress, last: Progress) -> float | None:
    """Units per second between two progress marks; None when no step finished in between."""
    if last.at <= first.at:
        return None
    return (last.done - first.done) / (last.at - first.at)
