"""Test double of cupti-python 13.4.0: the names smlens' capture uses, with the hardware simulated.

Checked 2026-11-30 against the cupti-python 13.4.0 wheel (cupti/cupti.pyi, cupti/pm_sampling.py,
cupti/profiler_host.py): the same module, class, attribute, enum and function names; each ``pm_sampling_*``
call takes the address of its params (``params.ptr``) and the image's address (``image.ctypes.data``), as the
real ones do. The decoding behaviour is what an H200 showed (docs/profile.md, "Samples without timestamps").
"""
