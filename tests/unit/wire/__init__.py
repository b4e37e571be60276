"""Unit tests of sidecar.wire: the codec, the frames, the broker address, the failover."""
