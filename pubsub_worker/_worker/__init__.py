"""The engine: one worker's lifecycle and one delivery's path to its outcome (internal)."""
