"""Text from outside (keys, errors) made safe to store, show and log.

A job key is attacker-controlled input and a Python ``str`` need not be valid
UTF-8 (lone surrogates, from ``os.fsdecode`` for one): :func:`raw` encodes any
``str`` without raising, :func:`display` clips it to valid UTF-8 for humans.
"""

from __future__ import annotations

__all__ = ["KEY_DISPLAY_BYTES", "display", "raw"]

KEY_DISPLAY_BYTES = 1024
"""A key is stored for humans and queries only up to this many bytes; the hash is the identity."""


def raw(text: str) -> bytes:
    """``text`` as bytes, whatever it holds (surrogatepass: lone surrogates never raise)."""
    return text.encode("utf-8", "surrogatepass")


def display(text: str, limit: int = KEY_DISPLAY_BYTES) -> str:
    """``text`` made safe to store and log: valid UTF-8, at most ``limit`` bytes, then ``…``."""
    if len(text) <= limit and text.isascii():  # most keys: nothing to change
        return text
    clean = raw(text).decode("utf-8", "replace").encode()
    if len(clean) <= limit:
        return clean.decode()
    return clean[:limit].decode("utf-8", "ignore") + "…"
