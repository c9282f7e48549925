"""Test double of NVIDIA's DCGM Python bindings; tests put this directory on sys.path to import them."""
