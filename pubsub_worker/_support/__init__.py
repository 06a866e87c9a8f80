"""Support code: logs, metrics, traces, production's limits, the clients (internal)."""
