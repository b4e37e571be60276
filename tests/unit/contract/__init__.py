"""Unit tests of sidecar.contract: the rules, the readers, the vectors, the producer label."""
