"""Workload attribution: which pod, container or Slurm job holds and uses each GPU.

Refreshed in the background (:mod:`smlens.attribution.refresher`); the sampler only reads the latest
immutable :class:`~smlens.model.Attribution`.
"""
