"""Integration tests: the sidecar in-process against a real RabbitMQ."""
