"""Tests of acemq-sidecar."""
