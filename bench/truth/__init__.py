"""Truth test: checks smlens' numbers against controlled kernels on a real GPU.

``python3 -m bench.truth`` runs the whole harness on a GPU host (see docs/validation.md). The pure parts
(expected values, metric parsing, comparison, report) import no GPU library and are unit-tested in CI.
"""
