"""``exactly_once``: wrap a subscriber callback so each job's effects happen once.

Order of operations for one delivery (see ``docs/architecture.md``)::

    register delivery ─► derive key ─► wait for the key in this process ─► claim
        completed/failed ─► ack            conflict/missing key ─► failure path ─► ack
        busy ─► wait up to 10 s, then nack
        claimed ─► publish unsent outbox ─► callback(message, job) ─► complete ─► ack

The ack is always the last thing done, after the completion record is durable.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import google.cloud.pubsub_v1 as pubsub_v1
from google.cloud import firestore
from google.cloud.pubsub_v1.subscriber.exceptions import AcknowledgeError, AcknowledgeStatus
from google.cloud.pubsub_v1.subscriber.message import Message

from . import clients
from .claim import ClaimKind, ClaimRequest, claim, now_utc
from .deliveries import Delivery, DeliveryTracker, KeyGate
from .errors import (
    ConfigError,
    InvalidMessage,
    LostOwnership,
    PermanentError,
    ProcessingTimeout,
    ShuttingDown,
)
from .failure import FailurePath, FailurePathUnavailable, Reason
from .job import Job, JobContext, Publish
from .keys import JobIdentity, derive_identity
from .lease import LOST_STATUSES, LeaseKeeper
from .logs import JobLogger, job_logger
from .metrics import Counter, Metrics
from .settings import Settings
from .store import JobStore
from .stores.batching import BatchingFirestoreJobStore
from .tracing import span

__all__ = ["ExactlyOnce", "exactly_once"]

_LOGGER = logging.getLogger("pubsub_worker")

BUSY_WAIT_S = 10.0
"""How long a delivery waits for another owner's live lease before it nacks."""
MAX_ERROR_CHARS = 4000

Handler = Callable[..., Any]


@dataclass
class _Runtime:
    settings: Settings
    store: JobStore
    publish: Publish
    tracker: DeliveryTracker
    gate: KeyGate
    keeper: LeaseKeeper
    metrics: Metrics
    failure: FailurePath
    context: JobContext
    owner: str
    eod_checked: bool


class ExactlyOnce:
    """A Pub/Sub callback that runs ``handler`` at most once per job epoch, to completion once.

    Pass it wherever a ``callback(message)`` goes (``subscriber.subscribe``)
    or to :func:`pubsub_worker.run`. ``handler`` is either
    ``handler(message, job)`` (steps through ``job``; returning means done) or
    an existing ``handler(message)`` that calls ``message.ack()`` /
    ``message.nack()``, which are intercepted: ack records the completion
    and then acks, nack releases the job for a retry.

    Nothing is read from the environment until :meth:`start` or the first
    message; call :meth:`start` yourself to fail fast on bad settings.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        settings: Settings | None = None,
        firestore_client: firestore.Client | None = None,
        publisher: pubsub_v1.PublisherClient | None = None,
        store: JobStore | None = None,
        subscriber: pubsub_v1.SubscriberClient | None = None,
    ) -> None:
        self._handler = handler
        self._legacy = not _takes_job(handler)
        self._settings = settings
        self._firestore_client = firestore_client
        self._publisher = publisher
        self._store = store
        self._subscriber = subscriber
        self._lock = threading.Lock()  # guards _runtime
        self._runtime: _Runtime | None = None
        self._stopping = threading.Event()
        self._warned_not_eod = False
        self.__wrapped__ = handler
        self.__name__ = getattr(handler, "__name__", type(self).__name__)
        self.__doc__ = getattr(handler, "__doc__", None)

    # -- lifecycle ----------------------------------------------------------------

    def start(self, settings: Settings | None = None, *, check_subscription: bool = True) -> None:
        """Read settings, build clients, check the subscription; idempotent.

        Raises :class:`~pubsub_worker.errors.ConfigError` for bad settings or
        a subscription without exactly-once delivery (unless
        ``ALLOW_AT_LEAST_ONCE``), :class:`~pubsub_worker.errors.Unreachable`
        when Pub/Sub or Firestore does not answer.
        """
        with self._lock:
            if self._runtime is None:
                self._runtime = self._build(settings or self._settings or Settings.from_env())
            runtime = self._runtime
            if check_subscription and not runtime.eod_checked:
                self._check_eod(runtime)
                runtime.eod_checked = True
            runtime.keeper.start()

    def close(self) -> None:
        """Stop the lease keeper. In-flight callbacks should have ended."""
        with self._lock:
            if self._runtime is not None:
                self._runtime.keeper.stop()

    def stop_jobs(self) -> None:
        """Ask in-flight jobs to stop at their next boundary; they are released, not acked."""
        self._stopping.set()

    @property
    def settings(self) -> Settings:
        """The settings in use (after :meth:`start` or the first message)."""
        return self._ensure().settings

    @property
    def metrics(self) -> Metrics:
        """Counters and gauges of this worker."""
        return self._ensure().metrics

    def in_flight(self) -> int:
        """Jobs being processed right now."""
        return 0 if self._runtime is None else self._runtime.keeper.in_flight()

    def _ensure(self) -> _Runtime:
        if self._runtime is None:
            self.start()
        assert self._runtime is not None
        return self._runtime

    def _build(self, settings: Settings) -> _Runtime:
        subscription = settings.subscription_path  # ConfigError when unset
        if self._store is None:
            client = self._firestore_client or clients.firestore_client(settings)
            if self._firestore_client is None:
                clients.check_firestore(client, settings)
            self._store = BatchingFirestoreJobStore(client, settings.collection)
        if self._publisher is None:
            self._publisher = clients.publisher_client(settings)
        publish = clients.publisher_function(self._publisher)
        metrics = Metrics()
        tracker = DeliveryTracker()
        keeper = LeaseKeeper(
            lease_s=settings.lease_seconds,
            max_processing_s=settings.max_processing_seconds,
            metrics=metrics,
        )
        metrics.gauge("in_flight", keeper.in_flight, "Jobs being processed now")
        metrics.gauge(
            "oldest_unacked_age_s", keeper.oldest_age_s, "Age of the oldest message in flight"
        )
        retention_s = settings.retention_days * 86400.0
        context = JobContext(
            store=self._store,
            tracker=tracker,
            metrics=metrics,
            publish=publish,
            topic_path=settings.topic_path,
            lease_s=settings.lease_seconds,
            retention_s=retention_s,
            io_timeout_s=settings.ack_timeout_seconds,
            outbox_key_attribute=settings.outbox_key_attribute,
            stopping=self._stopping,
        )
        failure = FailurePath(
            store=self._store,
            subscription=subscription,
            publish=publish,
            failure_topic=settings.failure_topic_path,
            metrics=metrics,
            retention_s=retention_s,
            io_timeout_s=settings.ack_timeout_seconds,
        )
        owner = f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"
        return _Runtime(
            settings=settings,
            store=self._store,
            publish=publish,
            tracker=tracker,
            gate=KeyGate(tracker),
            keeper=keeper,
            metrics=metrics,
            failure=failure,
            context=context,
            owner=owner,
            eod_checked=False,
        )

    def _check_eod(self, runtime: _Runtime) -> None:
        settings = runtime.settings
        subscriber = self._subscriber or clients.subscriber_client(settings)
        try:
            eod = clients.check_subscription(subscriber, settings)
        finally:
            if self._subscriber is None:
                subscriber.close()
        if eod:
            return
        if not settings.allow_at_least_once:
            raise ConfigError(
                f"subscription {settings.subscription_path} does not have exactly-once delivery "
                "enabled: a stale ack would be indistinguishable from a real one. Enable it "
                "(gcloud pubsub subscriptions update --enable-exactly-once-delivery) or set "
                "PUBSUB_WORKER_ALLOW_AT_LEAST_ONCE=true to accept at-least-once acks."
            )
        self._warn_at_least_once()

    def _warn_at_least_once(self) -> None:
        if not self._warned_not_eod:
            self._warned_not_eod = True
            _LOGGER.warning(
                "PUBSUB_WORKER_ALLOW_AT_LEAST_ONCE is set and the subscription has no "
                "exactly-once delivery: acks resolve without proof, a lapsed lease is not "
                "detected by Pub/Sub, and only the Firestore epoch fences stale workers"
            )

    # -- one delivery -------------------------------------------------------------

    def __call__(self, message: Message) -> None:
        """Handle one delivery; never raises (errors are logged, the message nacked or kept)."""
        try:
            runtime = self._ensure()
        except Exception:
            _LOGGER.exception(
                "job ? message %s: worker cannot start; message left to redeliver",
                message.message_id,
                extra={"job_key": None, "message_id": message.message_id},
            )
            message.drop()
            return
        runtime.metrics.inc(Counter.RECEIVED)
        seen = runtime.tracker.seen(message.message_id)
        delivery = runtime.tracker.register(message.message_id, message.ack_id)
        log = job_logger(_LOGGER, "?", message.message_id)
        try:
            if not message.exactly_once_enabled and not runtime.settings.allow_at_least_once:
                log.error("subscription has no exactly-once delivery; message not processed")
                message.drop()
                return
            self._handle(runtime, message, delivery, seen)
        except Exception:
            log.exception("unexpected error; message nacked")
            message.nack()
        finally:
            runtime.tracker.forget(delivery)

    def _handle(self, rt: _Runtime, message: Message, delivery: Delivery, seen: bool) -> None:
        settings = rt.settings
        try:
            identity = derive_identity(
                subscription=settings.subscription_path,
                message_id=message.message_id,
                attributes=message.attributes,
                data=message.data,
                key_attribute=settings.key_attribute,
            )
        except InvalidMessage as exc:
            self._to_failure(rt, message, None, Reason.MISSING_KEY, str(exc), None)
            return
        log = job_logger(_LOGGER, identity.key, message.message_id)
        if not rt.gate.acquire(identity.doc_id, delivery, timeout_s=settings.lease_seconds):
            self._stop_without_ack(rt, message, delivery, log, "key still busy in this process")
            return
        try:
            self._claim_and_run(rt, message, delivery, identity, log, seen)
        finally:
            rt.gate.release(identity.doc_id, delivery)

    def _claim_and_run(
        self,
        rt: _Runtime,
        message: Message,
        delivery: Delivery,
        identity: JobIdentity,
        log: JobLogger,
        seen: bool,
    ) -> None:
        settings = rt.settings
        request = ClaimRequest(
            identity=identity,
            owner=rt.owner,
            message_id=message.message_id,
            delivery=delivery.digest,
            lease_s=settings.lease_seconds,
            retention_s=settings.retention_days * 86400.0,
            superseded=rt.tracker.superseded,
        )
        redelivery = seen or (message.delivery_attempt or 1) > 1
        give_up = time.monotonic() + min(BUSY_WAIT_S, settings.lease_seconds)
        while True:
            if not rt.tracker.is_current(delivery):
                self._stop_without_ack(rt, message, delivery, log, "superseded before the claim")
                return
            result = claim(rt.store, request, exists_hint=redelivery)
            redelivery = True
            if result.kind is not ClaimKind.BUSY:
                break
            wait_s = _seconds_until(result.busy_until)
            if time.monotonic() + min(wait_s, 1.0) >= give_up or self._stopping.is_set():
                rt.metrics.inc(Counter.BUSY)
                log.info("another owner holds the job for %.1f s more; nacked", wait_s)
                message.nack()
                return
            time.sleep(min(max(wait_s, 0.05), 1.0))
        if result.kind in (ClaimKind.COMPLETED, ClaimKind.FAILED):
            rt.metrics.inc(Counter.ALREADY_DONE)
            log.info("job already %s; acked without running", result.kind.value)
            self._ack(rt, message, log)
            return
        if result.kind is ClaimKind.CONFLICT:
            error = "the key was already used for a message with a different payload"
            self._to_failure(rt, message, identity.key, Reason.PAYLOAD_CONFLICT, error, None)
            return
        assert result.record is not None
        assert result.version is not None
        job = Job(
            identity=identity,
            delivery=delivery,
            record=result.record,
            version=result.version,
            context=rt.context,
            log=log,
        )
        rt.keeper.track(job, message, message.publish_time.timestamp())
        try:
            with span(
                "pubsub_worker.job",
                **{"messaging.message.id": message.message_id, "pubsub_worker.epoch": job.epoch},
            ):
                self._run(rt, message, job, log)
        finally:
            rt.keeper.untrack(job)

    def _run(self, rt: _Runtime, message: Message, job: Job, log: JobLogger) -> None:
        settings = rt.settings
        try:
            job.check()
            if job.attempt > settings.max_attempts:
                error = f"gave up after {settings.max_attempts} attempts"
                self._to_failure(rt, message, job.key, Reason.ATTEMPTS, error, job)
                return
            job.publish_unsent()
            if self._legacy:
                proxy = _MessageProxy(message, job, self, rt, log)
                try:
                    self._handler(proxy)
                except Exception:
                    if proxy.outcome is None:
                        raise
                    log.exception("callback raised after message.%s(); ignored", proxy.outcome)
                proxy.finish()
                return
            self._handler(message, job)
            job.complete()
        except ShuttingDown:
            self._release(rt, message, job, log, None, count_attempt=False)
            return
        except ProcessingTimeout as exc:
            self._retry_or_fail(rt, message, job, log, exc)
            return
        except LostOwnership as exc:
            self._stop_without_ack(rt, message, job.delivery, log, f"ownership lost ({exc})")
            return
        except PermanentError as exc:
            self._fail_job(rt, message, job, log, Reason.PERMANENT, _describe(exc))
            return
        except Exception as exc:  # noqa: BLE001 - user code failed: a retryable attempt
            self._retry_or_fail(rt, message, job, log, exc)
            return
        rt.metrics.inc(Counter.COMPLETED)
        log.info("completed (attempt %d, epoch %d)", job.attempt, job.epoch)
        self._ack(rt, message, log)

    # -- outcomes -----------------------------------------------------------------

    def _retry_or_fail(
        self, rt: _Runtime, message: Message, job: Job, log: JobLogger, exc: BaseException
    ) -> None:
        error = _describe(exc)
        if job.attempt >= rt.settings.max_attempts:
            log.warning("attempt %d failed: %s", job.attempt, error, exc_info=exc)
            self._fail_job(rt, message, job, log, Reason.ATTEMPTS, error)
            return
        log.warning("attempt %d failed, will retry: %s", job.attempt, error, exc_info=exc)
        self._release(rt, message, job, log, error, count_attempt=True)

    def _release(
        self,
        rt: _Runtime,
        message: Message,
        job: Job,
        log: JobLogger,
        error: str | None,
        *,
        count_attempt: bool,
    ) -> None:
        try:
            job.release(error, count_attempt=count_attempt)
        except LostOwnership:
            self._stop_without_ack(rt, message, job.delivery, log, "ownership lost")
            return
        rt.metrics.inc(Counter.RETRIED)
        message.nack()

    def _fail_job(
        self, rt: _Runtime, message: Message, job: Job, log: JobLogger, reason: str, error: str
    ) -> None:
        try:
            self._to_failure(rt, message, job.key, reason, error, job)
        except LostOwnership:
            self._stop_without_ack(rt, message, job.delivery, log, "ownership lost")

    def _to_failure(
        self,
        rt: _Runtime,
        message: Message,
        key: str | None,
        reason: str,
        error: str,
        job: Job | None,
    ) -> None:
        try:
            rt.failure.send(
                message_id=message.message_id,
                data=message.data,
                attributes=message.attributes,
                key=key,
                reason=reason,
                error=error,
                job=job,
            )
        except LostOwnership:
            raise
        except FailurePathUnavailable as exc:
            _LOGGER.error("message %s: %s", message.message_id, exc)
            message.nack()
            return
        except Exception:
            _LOGGER.exception("message %s: failure path failed; nacked", message.message_id)
            message.nack()
            return
        log = job_logger(_LOGGER, key or "?", message.message_id)
        self._ack(rt, message, log)

    def _stop_without_ack(
        self, rt: _Runtime, message: Message, delivery: Delivery, log: JobLogger, why: str
    ) -> None:
        rt.metrics.inc(Counter.LOST_OWNERSHIP)
        if rt.tracker.is_current(delivery):
            log.info("%s; nacked for redelivery", why)
            message.nack()
        else:
            log.info("%s; this delivery is stale and is dropped without ack", why)
            message.drop()

    def _ack(self, rt: _Runtime, message: Message, log: JobLogger) -> None:
        try:
            message.ack_with_response().result(timeout=rt.settings.ack_timeout_seconds)
        except AcknowledgeError as exc:
            if exc.error_code in LOST_STATUSES:
                rt.metrics.inc(Counter.ACKS_LOST)
                log.info("ack refused (%s); the job is complete, nothing is lost", exc.error_code)
            else:
                rt.metrics.inc(Counter.ACK_ERRORS)
                log.warning("ack failed (%s); a redelivery will ack", exc.error_code)
        except concurrent.futures.TimeoutError:
            rt.metrics.inc(Counter.ACK_ERRORS)
            log.warning(
                "no ack response in %.0f s; a redelivery will ack", rt.settings.ack_timeout_seconds
            )
        except Exception as exc:  # noqa: BLE001 - an ack error never fails a completed job
            rt.metrics.inc(Counter.ACK_ERRORS)
            log.warning("ack failed (%s); a redelivery will ack", exc)


class _MessageProxy:
    """The message an existing ``callback(message)`` sees: ack/nack go through the job."""

    def __init__(
        self, message: Message, job: Job, owner: ExactlyOnce, rt: _Runtime, log: JobLogger
    ) -> None:
        self._message = message
        self._owner = owner
        self._rt = rt
        self._log = log
        self.job = job
        """The job, for callbacks that want steps (``message.job.step(...)``)."""
        self.outcome: str | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._message, name)

    def __repr__(self) -> str:
        return f"<exactly-once {self._message!r}>"

    def ack(self) -> None:
        """Record the completion, then ack (once)."""
        if self.outcome is not None:
            return
        try:
            self.job.complete()
        except LostOwnership:
            self.outcome = "lost"
            self._owner._stop_without_ack(
                self._rt, self._message, self.job.delivery, self._log, "ownership lost"
            )
            return
        self.outcome = "ack"
        self._rt.metrics.inc(Counter.COMPLETED)
        self._owner._ack(self._rt, self._message, self._log)

    def ack_with_response(self) -> concurrent.futures.Future[AcknowledgeStatus]:
        """Like :meth:`ack`; the future resolves when the ack was attempted."""
        self.ack()
        return _resolved(AcknowledgeStatus.SUCCESS)

    def nack(self) -> None:
        """Release the job for a retry (counts an attempt), then nack."""
        if self.outcome is not None:
            return
        self.outcome = "nack"
        self._owner._retry_or_fail(
            self._rt, self._message, self.job, self._log, RuntimeError("callback nacked")
        )

    def nack_with_response(self) -> concurrent.futures.Future[AcknowledgeStatus]:
        """Like :meth:`nack`."""
        self.nack()
        return _resolved(AcknowledgeStatus.SUCCESS)

    def modify_ack_deadline(self, seconds: int) -> None:
        """Counts as progress (a heartbeat) and passes through."""
        self.job.heartbeat()
        self._message.modify_ack_deadline(seconds)

    def finish(self) -> None:
        """After the callback returned: a callback that neither acked nor nacked is retried."""
        if self.outcome is None:
            self._log.warning("callback returned without ack() or nack(); treated as nack")
            self.nack()


def exactly_once(
    handler: Handler | None = None,
    *,
    settings: Settings | None = None,
    firestore_client: firestore.Client | None = None,
    publisher: pubsub_v1.PublisherClient | None = None,
    store: JobStore | None = None,
    subscriber: pubsub_v1.SubscriberClient | None = None,
) -> Any:
    """Wrap a callback for exactly-once processing; usable bare or with arguments.

    ``@exactly_once`` or ``@exactly_once(settings=..., firestore_client=...)``.
    Returns an :class:`ExactlyOnce`, which takes ``(message)`` like any
    Pub/Sub callback.
    """

    def wrap(fn: Handler) -> ExactlyOnce:
        return ExactlyOnce(
            fn,
            settings=settings,
            firestore_client=firestore_client,
            publisher=publisher,
            store=store,
            subscriber=subscriber,
        )

    return wrap(handler) if handler is not None else wrap


def _takes_job(handler: Handler) -> bool:
    try:
        params = inspect.signature(handler).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = 0
    for param in params:
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            return True
        if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
            positional += 1
    return positional >= 2


def _seconds_until(when: datetime | None) -> float:
    if when is None:
        return 0.0
    return (when - now_utc()).total_seconds()


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "…"


def _resolved(status: AcknowledgeStatus) -> concurrent.futures.Future[AcknowledgeStatus]:
    future: concurrent.futures.Future[AcknowledgeStatus] = concurrent.futures.Future()
    future.set_result(status)
    return future
