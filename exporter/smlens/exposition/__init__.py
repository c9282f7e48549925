"""The snapshot as Prometheus metrics: the custom collectors, and the bodies the sampler renders once per
tick for /metrics to serve."""
