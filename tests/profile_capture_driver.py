"""``smlens profile`` as a user runs it, over the cupti-python double, for tests that signal the process.

Run as ``python tests/profile_capture_driver.py [--hang-worker] PROFILE-ARGS...``: NVML and the CUDA context
are skipped (one fake H200), and a thread writes about 10 records per millisecond into the double's hardware
buffer. It prints ``worker PID`` to stdout once the evaluator process is up. With ``--hang-worker``, the
worker's evaluations never return, and the capture gives up waiting for one after 2 s."""

from __future__ import annotations

import functools
import multiprocessing
import signal
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "fakes" / "fake_cupti"))


def main() -> int:
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal, whoever started this
    import cupti.cupti as cu

    import smlens.profile.cuda as cuda
    import smlens.profile.cupti_session as session
    from smlens.cli import main as smlens
    from smlens.profile.evaluator import ImagePipeline

    cuda.retain_primary_context = lambda ordinal: None  # type: ignore[assignment]
    session.resolve_gpu = lambda selector: session.Gpu(0, "GPU-0", "NVIDIA H200", 0)  # type: ignore[assignment]
    started = ImagePipeline.__init__

    def announce(self: ImagePipeline, *args: object, **kwargs: object) -> None:
        started(self, *args, **kwargs)  # type: ignore[arg-type]
        print(
            "worker", *(p.pid for p in multiprocessing.active_children() if "Process" in p.name), flush=True
        )

    ImagePipeline.__init__ = announce  # type: ignore[method-assign]
    args = sys.argv[1:]
    if args[:1] == ["--hang-worker"]:
        from profile_worker_double import hanging
        from smlens.profile import evaluator

        evaluator.RESULT_TIMEOUT_S = 2
        session.ImagePipeline = functools.partial(ImagePipeline, job=hanging)  # type: ignore[misc]
        args = args[1:]
    stop = threading.Event()

    def gpu() -> None:
        while not stop.wait(0.001):
            cu.HARDWARE.feed(10)

    threading.Thread(target=gpu, daemon=True).start()
    return smlens(["profile", *args])


if __name__ == "__main__":  # the evaluator is spawned: it imports this file again
    sys.exit(main())
