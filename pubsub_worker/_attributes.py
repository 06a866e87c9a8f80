"""The message attributes pubsub-worker stamps on what it publishes, in one place.

=====================================  ==============================  ===========================
Attribute                              Stamped by                      Why
=====================================  ==============================  ===========================
``effect_key`` (default of             the outbox, on every message a  a consumer keyed on it drops
``OUTBOX_KEY_ATTRIBUTE``)              step publishes                  a republished copy
``pubsub_worker_step``                 the outbox, same messages       the step that published it
``pubsub_worker_replay_of``            ``jobs replay``, on a job       the replayed job keeps its
                                       keyed by its message id         key (the old message id)
``pubsub_worker_reason``               the failure path, on the        why the job was sent to
                                       failure topic's message         review
``pubsub_worker_error``                the failure path                the error, clipped
``pubsub_worker_key``                  the failure path                the job's key
``pubsub_worker_message_id``           the failure path                the original message id
``pubsub_worker_subscription``         the failure path                where it was consumed
``pubsub_worker_attempts``             the failure path                claims made of the job
``pubsub_worker_attributes_left_out``  the failure path, when some     how many original
                                       originals did not fit           attributes were left out
=====================================  ==============================  ===========================

Every name but the outbox key starts with :data:`LIBRARY_ATTRIBUTE_PREFIX`: a
user's own outbox message may not set such an attribute, and the failure
message drops an original attribute that has one.
"""

from __future__ import annotations

__all__ = [
    "ATTEMPTS_ATTRIBUTE",
    "DEFAULT_OUTBOX_KEY_ATTRIBUTE",
    "ERROR_ATTRIBUTE",
    "KEY_ATTRIBUTE",
    "LEFT_OUT_ATTRIBUTE",
    "LIBRARY_ATTRIBUTE_PREFIX",
    "MESSAGE_ID_ATTRIBUTE",
    "REASON_ATTRIBUTE",
    "REPLAY_OF_ATTRIBUTE",
    "REVIEW_ATTRIBUTES",
    "STEP_ATTRIBUTE",
    "SUBSCRIPTION_ATTRIBUTE",
]

LIBRARY_ATTRIBUTE_PREFIX = "pubsub_worker_"
"""Attributes the library sets on what it publishes start with this."""

DEFAULT_OUTBOX_KEY_ATTRIBUTE = "effect_key"
"""Where an outbox message carries its effect key, unless ``OUTBOX_KEY_ATTRIBUTE`` says."""

STEP_ATTRIBUTE = LIBRARY_ATTRIBUTE_PREFIX + "step"
"""An outbox message's step name."""

REPLAY_OF_ATTRIBUTE = LIBRARY_ATTRIBUTE_PREFIX + "replay_of"
"""Set by ``pubsub-worker jobs replay`` when it republishes a failed job whose key was its
message id: the replayed message keeps the original key instead of getting a new one."""

REASON_ATTRIBUTE = LIBRARY_ATTRIBUTE_PREFIX + "reason"
ERROR_ATTRIBUTE = LIBRARY_ATTRIBUTE_PREFIX + "error"
KEY_ATTRIBUTE = LIBRARY_ATTRIBUTE_PREFIX + "key"
MESSAGE_ID_ATTRIBUTE = LIBRARY_ATTRIBUTE_PREFIX + "message_id"
SUBSCRIPTION_ATTRIBUTE = LIBRARY_ATTRIBUTE_PREFIX + "subscription"
ATTEMPTS_ATTRIBUTE = LIBRARY_ATTRIBUTE_PREFIX + "attempts"
LEFT_OUT_ATTRIBUTE = LIBRARY_ATTRIBUTE_PREFIX + "attributes_left_out"
"""The failure message: how many of the original attributes did not fit it."""

REVIEW_ATTRIBUTES = (
    REASON_ATTRIBUTE,
    ERROR_ATTRIBUTE,
    KEY_ATTRIBUTE,
    MESSAGE_ID_ATTRIBUTE,
    SUBSCRIPTION_ATTRIBUTE,
    ATTEMPTS_ATTRIBUTE,
    LEFT_OUT_ATTRIBUTE,
)
"""Every attribute the failure path may stamp on the failure message."""
