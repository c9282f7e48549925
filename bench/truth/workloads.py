"""Controlled GPU workloads, each run in steps of about 0.1 s on a background thread.

A workload's ``step()`` does one batch of work, waits for the GPU to finish it, and returns how much it
did in its unit (bytes moved, floating-point operations, tokens, or nothing), so the harness can compare
what the workload achieved over a window with what smlens saw. Needs CuPy and PyTorch (GPU hosts only);
the GPT-2 workloads also Hugging Face transformers (random weights from ``GPT2Config()``: nothing is
downloaded).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bench.truth.expect import (
    CHASE_BYTES,
    SECTOR_BYTES,
    DeviceLimits,
    Spin,
    chase_dram_floor,
    pipe_shape,
    spin_shapes,
)

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
LAUNCH_SECONDS = 0.05  # a raw-kernel workload's launch: two a step

FMA_KERNEL = "smlens_truth_fma"
FMA_PER_ITERATION = 128  # 8 independent chains x 16 unrolled
# Independent FMA chains: 8 per thread keep the FP32 pipe issuing every cycle with a few warps per
# scheduler; the sum is written only if it is -1 (never), so the compiler keeps every chain.
_FMA_SOURCE = r"""
extern "C" __global__ void smlens_truth_fma(float* sink, int iterations, float a, float b) {
    float x0 = threadIdx.x * 1e-6f, x1 = x0 + 0.1f, x2 = x0 + 0.2f, x3 = x0 + 0.3f;
    float x4 = x0 + 0.4f, x5 = x0 + 0.5f, x6 = x0 + 0.6f, x7 = x0 + 0.7f;
    for (int i = 0; i < iterations; ++i) {
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            x0 = fmaf(x0, a, b); x1 = fmaf(x1, a, b); x2 = fmaf(x2, a, b); x3 = fmaf(x3, a, b);
            x4 = fmaf(x4, a, b); x5 = fmaf(x5, a, b); x6 = fmaf(x6, a, b); x7 = fmaf(x7, a, b);
        }
    }
    float sum = ((x0 + x1) + (x2 + x3)) + ((x4 + x5) + (x6 + x7));
    if (sum == -1.0f) sink[blockIdx.x * blockDim.x + threadIdx.x] = sum;
}
"""
CHASE_KERNEL = "smlens_truth_chase"
# Each thread follows a random permutation from its own start: every load's address is the previous
# load's value, so a warp has one load in flight and waits out its whole latency.
_CHASE_SOURCE = r"""
extern "C" __global__ void smlens_truth_chase(const int* __restrict__ next, int* sink, int steps,
                                              unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    int p = (int)(((unsigned long long)i * 2654435761ull) % n);
    for (int s = 0; s < steps; ++s) p = next[p];
    sink[i] = p;
}
"""
COPY_KERNEL = "smlens_truth_copy"
# A grid-stride copy in 16-byte words: the copy workload's stand-in under ncu.
_COPY_SOURCE = r"""
extern "C" __global__ void smlens_truth_copy(const uint4* __restrict__ source, uint4* __restrict__ target,
                                             unsigned long long count) {
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < count;
         i += stride)
        target[i] = source[i];
}
"""
GPT2_BATCH = 16
GPT2_SEQUENCE = 1024
GPT2_PROMPT = 32
GPT2_NEW_TOKENS = 32


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


def placed_kernel(source: str, name: str, shape: Spin) -> Any:
    """A compiled raw kernel; raises unless ``shape.blocks_per_sm`` of its blocks fit on one SM."""
    import cupy  # type: ignore[import-not-found,unused-ignore]

    kernel = cupy.RawKernel(source, name)
    resident = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.kernel.ptr, shape.threads, 0)
    if resident < shape.blocks_per_sm:
        raise RuntimeError(
            f"{name}: the occupancy API allows {resident} blocks of {shape.threads} threads per SM, "
            f"the launch needs {shape.blocks_per_sm}."
        )
    return kernel


class RawKernelWorkload(Workload):
    """A CuPy raw kernel over ``shape`` whose launches each do ``count`` units of work (iterations or
    steps), sized in prepare() to last about ``launch_seconds``."""

    source = ""
    kernel_name = ""
    probe = 1  # the count of the timing launch

    def __init__(self, name: str, description: str, unit: str, shape: Spin, launch_seconds: float) -> None:
        self.name, self.description, self.unit = name, description, unit
        self.shape, self.launch_seconds = shape, launch_seconds
        self.count = self.probe
        self._kernel: Any = None
        self._buffers: list[Any] = []

    @property
    def threads(self) -> int:
        return self.shape.blocks * self.shape.threads

    def allocate(self) -> list[Any]:
        return []

    def arguments(self, count: int) -> tuple[Any, ...]:
        raise NotImplementedError

    def done(self, count: int) -> float:
        """Units of the workload's ``unit`` one launch of ``count`` does."""
        return 0.0

    def launch(self, count: int) -> None:
        self._kernel((self.shape.blocks,), (self.shape.threads,), self.arguments(count))

    def launch_once(self) -> None:
        self.launch(self.count)

    def prepare(self) -> None:
        import cupy  # type: ignore[import-not-found,unused-ignore]

        self._buffers = self.allocate()
        self._kernel = placed_kernel(self.source, self.kernel_name, self.shape)
        device = cupy.cuda.Device()
        count = self.probe
        for _ in range(3):  # compile and warm up, then time twice (the clocks ramp up meanwhile)
            started = time.perf_counter()
            self.launch(count)
            device.synchronize()
            spent = time.perf_counter() - started
            count = max(1, int(count * self.launch_seconds / max(spent, 1e-6)))
        self.count = count

    def step(self) -> float:
        import cupy  # type: ignore[import-not-found,unused-ignore]

        launches = max(1, round(STEP_SECONDS / self.launch_seconds))
        for _ in range(launches):
            self.launch(self.count)
        cupy.cuda.Device().synchronize()
        return launches * self.done(self.count)

    def release(self) -> None:
        import cupy  # type: ignore[import-not-found,unused-ignore]

        self._buffers.clear()
        cupy.cuda.Device().synchronize()
        cupy.get_default_memory_pool().free_all_blocks()


class Fp32Fma(RawKernelWorkload):
    source, kernel_name, probe = _FMA_SOURCE, FMA_KERNEL, 256

    def __init__(self, limits: DeviceLimits, launch_seconds: float = LAUNCH_SECONDS) -> None:
        shape = pipe_shape(limits)
        super().__init__(
            "fp32_fma",
            f"FP32 FMA chains, {shape.blocks_per_sm} blocks x {shape.threads} threads per SM, "
            "8 independent chains a thread",
            "flop",
            shape,
            launch_seconds,
        )

    def allocate(self) -> list[Any]:
        import cupy  # type: ignore[import-not-found,unused-ignore]

        return [cupy.zeros(self.threads, dtype=cupy.float32)]

    def arguments(self, count: int) -> tuple[Any, ...]:
        import cupy  # type: ignore[import-not-found,unused-ignore]

        return (self._buffers[0], cupy.int32(count), cupy.float32(0.999), cupy.float32(0.001))

    def done(self, count: int) -> float:
        return 2.0 * FMA_PER_ITERATION * count * self.threads


class PointerChase(RawKernelWorkload):
    source, kernel_name, probe = _CHASE_SOURCE, CHASE_KERNEL, 64

    def __init__(
        self, limits: DeviceLimits, launch_seconds: float = LAUNCH_SECONDS, size: int = CHASE_BYTES
    ) -> None:
        shape = pipe_shape(limits)
        super().__init__(
            "pointer_chase",
            f"pointer chase over {size / 2**30:.0f} GiB (a random permutation), "
            f"{shape.blocks_per_sm} blocks x {shape.threads} threads per SM",
            "bytes",
            shape,
            launch_seconds,
        )
        self.entries = size // 4
        self.miss_share = chase_dram_floor(limits, size)

    def allocate(self) -> list[Any]:
        import cupy  # type: ignore[import-not-found,unused-ignore]

        order = cupy.random.RandomState(0).permutation(self.entries)
        following = order.astype(cupy.int32)
        del order
        cupy.get_default_memory_pool().free_all_blocks()
        return [following, cupy.zeros(self.threads, dtype=cupy.int32)]

    def arguments(self, count: int) -> tuple[Any, ...]:
        import cupy  # type: ignore[import-not-found,unused-ignore]

        following, sink = self._buffers
        return (following, sink, cupy.int32(count), cupy.uint32(self.entries))

    def done(self, count: int) -> float:
        """DRAM bytes at least: a sector for each load that misses the L2 (a lower bound)."""
        return count * self.threads * SECTOR_BYTES * self.miss_share


class CopyKernel(RawKernelWorkload):
    """One copy of ``size`` bytes per launch, in 16-byte words (the copy workload under ncu)."""

    source, kernel_name = _COPY_SOURCE, COPY_KERNEL

    def __init__(self, limits: DeviceLimits, size: int) -> None:
        super().__init__(
            "copy_d2d", f"CuPy copy kernel of {size / 2**30:.1f} GiB", "bytes", pipe_shape(limits), 0
        )
        self.size = size - size % 16

    def allocate(self) -> list[Any]:
        import cupy  # type: ignore[import-not-found,unused-ignore]

        return [cupy.ones(self.size, dtype=cupy.uint8), cupy.empty(self.size, dtype=cupy.uint8)]

    def arguments(self, count: int) -> tuple[Any, ...]:
        import cupy  # type: ignore[import-not-found,unused-ignore]

        source, target = self._buffers
        return (source, target, cupy.uint64(self.size // 16))

    def prepare(self) -> None:
        import cupy  # type: ignore[import-not-found,unused-ignore]

        self._buffers = self.allocate()
        self._kernel = placed_kernel(self.source, self.kernel_name, self.shape)
        self.launch(1)
        cupy.cuda.Device().synchronize()

    def done(self, count: int) -> float:
        return 2.0 * self.size


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

    def launch_once(self) -> None:
        self.operate()

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


class Gpt2(Workload):
    """Hugging Face transformers' GPT-2 (124M parameters, ``GPT2Config()``), random weights."""

    unit = "tokens"

    def __init__(self) -> None:
        self._model: Any = None
        self._ids: Any = None

    def build(self) -> Any:
        import torch  # type: ignore[import-not-found,unused-ignore]
        import transformers  # type: ignore[import-not-found,unused-ignore]

        transformers.logging.set_verbosity_error()
        torch.manual_seed(0)
        config = transformers.GPT2Config()
        with torch.device("cuda"):  # weights made on the GPU: no CPU initialisation of 124M parameters
            model = transformers.GPT2LMHeadModel(config)
        return config, model.to("cuda")

    def release(self) -> None:
        import torch  # type: ignore[import-not-found,unused-ignore]

        self._model = self._ids = None
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


class Gpt2Train(Gpt2):
    name = "gpt2_train"
    description = (
        f"GPT-2 124M training steps (AdamW), bf16 autocast, batch {GPT2_BATCH} x {GPT2_SEQUENCE} tokens"
    )

    def prepare(self) -> None:
        import torch  # type: ignore[import-not-found,unused-ignore]

        config, self._model = self.build()
        self._model.config.use_cache = False
        self._model.train()
        self._optimizer = torch.optim.AdamW(self._model.parameters(), lr=1e-4, fused=True)
        self._ids = torch.randint(0, config.vocab_size, (GPT2_BATCH, GPT2_SEQUENCE), device="cuda")
        for _ in range(3):  # the allocator and cuBLAS settle
            self.step()

    def step(self) -> float:
        import torch  # type: ignore[import-not-found,unused-ignore]

        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self._model(input_ids=self._ids, labels=self._ids).loss
        loss.backward()
        self._optimizer.step()
        self._optimizer.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        return float(GPT2_BATCH * GPT2_SEQUENCE)

    def release(self) -> None:
        self._optimizer = None
        super().release()


class Gpt2Generate(Gpt2):
    name = "gpt2_generate"
    description = (
        f"GPT-2 124M generate(), batch 1, bf16 weights, greedy, {GPT2_NEW_TOKENS} new tokens "
        f"after a {GPT2_PROMPT}-token prompt"
    )

    def prepare(self) -> None:
        import torch  # type: ignore[import-not-found,unused-ignore]

        config, model = self.build()
        self._model = model.to(torch.bfloat16).eval()
        self._eos = config.eos_token_id
        self._ids = torch.randint(0, config.vocab_size, (1, GPT2_PROMPT), device="cuda")
        self.step()

    def step(self) -> float:
        import torch  # type: ignore[import-not-found,unused-ignore]

        with torch.inference_mode():
            self._model.generate(
                self._ids,
                attention_mask=torch.ones_like(self._ids),
                max_new_tokens=GPT2_NEW_TOKENS,
                min_new_tokens=GPT2_NEW_TOKENS,
                do_sample=False,
                pad_token_id=self._eos,
            )
        torch.cuda.synchronize()
        return float(GPT2_NEW_TOKENS)


def copy_bytes(limits: DeviceLimits) -> int:
    """The copy workload's size: 1 GiB, or 16 x the L2 where that is more."""
    return max(2**30, 16 * limits.l2_bytes)


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
        Copy(copy_bytes(limits)),
        Softmax(max(16384, big // 2 // (4 * columns)), columns),
        Fp32Fma(limits),
        PointerChase(limits),
        Gpt2Train(),
        Gpt2Generate(),
    ]


def pipe_targets(limits: DeviceLimits, names: Sequence[str], launch_seconds: float) -> list[Any]:
    """The workloads ncu's pipe run launches once each (bench.truth.ground_truth.PIPE_TARGETS), in order
    of ``names``: each has prepare(), launch_once() and release()."""
    made: dict[str, Any] = {
        "fp32_fma": lambda: Fp32Fma(limits, launch_seconds),
        "pointer_chase": lambda: PointerChase(limits, launch_seconds),
        "copy_d2d": lambda: CopyKernel(limits, copy_bytes(limits)),
        "gemm_bf16": lambda: Gemm("gemm_bf16", 8192, 8, "bf16 GEMM 8192 x 8192 x 8192"),
    }
    return [made[name]() for name in names]


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
