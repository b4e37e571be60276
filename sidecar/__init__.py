"""acemq-sidecar: enforces the AceMQ envelope wire contract between applications and RabbitMQ."""

__version__ = "0.1.0"
