"""Process-level tests: the sidecar run as ``python -m sidecar run`` against a real broker."""
