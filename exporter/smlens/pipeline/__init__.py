"""The sampling pipeline: the sampler thread, the fold of readings into state, backend health and the
choice of profiling source; and the wiring that builds it from the settings."""
