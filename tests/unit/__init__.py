"""Pure unit tests: no broker, no process."""
