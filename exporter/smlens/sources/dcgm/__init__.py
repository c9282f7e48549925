"""DCGM as a source: NVIDIA's bindings, the backend over a hostengine, and its MIG hierarchy."""
