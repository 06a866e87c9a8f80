"""A Firestore sink that rejects writes carrying an older epoch (a fencing token)."""

from .sink import FencedSink, StaleEpoch

__all__ = ["FencedSink", "StaleEpoch"]
