"""Runnable examples of pubsub-worker, each with its own test (``nox -s samples``)."""
