"""The worker's HTTP endpoint: Prometheus metrics, liveness and readiness.

``pubsub-worker run --metrics-port N`` (``run(..., metrics_port=N)``) serves:

============  ======================================================================
path          answer
============  ======================================================================
``/metrics``  every counter, gauge and histogram of :class:`~pubsub_worker.Metrics`
              in the Prometheus text format (``pubsub_worker_*``; durations in
              seconds, as OpenTelemetry's Prometheus exporter would name them)
``/livez``    200 while the worker serves its subscription (starting, running or
              draining after a stop request); 503 with the reason once the
              streaming pull ended by itself (a fatal error). ``/healthz`` is the same.
``/readyz``   200 only while the worker has started and its streaming pull runs; 503
              with the reason while starting, stopping, or after the pull ended
============  ======================================================================

The stock client reports a streaming pull that ended for good (permission
revoked, subscription deleted, a non-retryable error) only through its
future; :class:`Health` holds that future and reads it on every probe, so a
probe sees the failure the moment it happens.

``/metrics`` needs ``prometheus-client`` (``pip install 'pubsub-exactly-once[prometheus]'``).
Without it the probes answer as above, ``/metrics`` answers 501 with that
command as its body, and :meth:`MetricsServer.start` logs one warning saying
so. The server is a ``ThreadingHTTPServer`` in a named daemon thread; it
serves nothing else.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pubsub_worker._support.distribution import install_line
from pubsub_worker._support.metrics import BUCKETS_S, Counter, Histogram, Metrics

__all__ = [
    "DEFAULT_HOST",
    "METRICS_UNAVAILABLE",
    "Health",
    "MetricsServer",
    "prometheus_available",
    "prometheus_text",
]

_LOGGER = logging.getLogger("pubsub_worker")

DEFAULT_HOST = "0.0.0.0"  # noqa: S104 - a probe or scraper reaches a container from outside
"""Where the endpoint listens by default: every interface, as Cloud Run and GKE probes need."""

_INSTALL = install_line("prometheus")

METRICS_UNAVAILABLE = f"/metrics needs prometheus-client: {_INSTALL}"
"""What ``/metrics`` answers (status 501) when ``prometheus-client`` is not installed."""


class Health:
    """What the probes answer, from the worker's phase and its streaming pull future.

    The runner calls :meth:`running` once it subscribed and :meth:`stopping`
    when asked to stop; every probe reads the future afresh. Thread-safe:
    ``_lock`` guards the phase and the future.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._future: Future[Any] | None = None
        self._stopping = False

    def running(self, future: Future[Any]) -> None:
        """The worker started and consumes through ``future`` (the streaming pull)."""
        with self._lock:
            self._future = future

    def stopping(self) -> None:
        """A stop was requested: not ready any more, still alive while it drains."""
        with self._lock:
            self._stopping = True

    def _pull_failure(self) -> str | None:
        """Why the streaming pull ended by itself, or None while it runs (or was cancelled)."""
        future = self._future
        if future is None or not future.done() or future.cancelled():
            return None
        try:
            error = future.exception(timeout=0)
        except Exception as exc:  # noqa: BLE001 - whatever the future holds is the reason
            error = exc
        if error is None:
            return None if self._stopping else "the streaming pull ended"
        return f"the streaming pull ended: {type(error).__name__}: {error}"

    def live(self) -> tuple[bool, str]:
        """Liveness and its reason."""
        with self._lock:
            failure = self._pull_failure()
        return (False, failure) if failure else (True, "ok")

    def ready(self) -> tuple[bool, str]:
        """Readiness and its reason."""
        with self._lock:
            failure = self._pull_failure()
            if failure:
                return False, failure
            if self._stopping:
                return False, "stopping: no new messages are taken"
            if self._future is None:
                return False, "starting"
            if self._future.done():
                return False, "the streaming pull ended"
            return True, "ok"


# -- Prometheus text ----------------------------------------------------------------


def _metric_name(name: str) -> str:
    """Prometheus spelling: dots to underscores, ``_s`` to ``_seconds`` (base units)."""
    name = name.replace(".", "_")
    if name.endswith("_s"):
        name = name[:-2] + "_seconds"
    return name


def _families(metrics: Metrics) -> Iterator[Any]:
    from prometheus_client.core import (  # noqa: PLC0415 - optional extra
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    for counter in Counter:
        counted = CounterMetricFamily(
            f"pubsub_worker_{counter.value}", (counter.__doc__ or "").strip()
        )
        counted.add_metric([], metrics.get(counter))
        yield counted
    for name, (value, description) in sorted(metrics.gauges().items()):
        gauge = GaugeMetricFamily(f"pubsub_worker_{_metric_name(name)}", description)
        gauge.add_metric([], value)
        yield gauge
    for histogram in Histogram:
        snapshot = metrics.histogram(histogram)
        cumulative, buckets = 0, []
        for bound, count in zip((*map(str, BUCKETS_S), "+Inf"), snapshot.counts, strict=True):
            cumulative += count
            buckets.append((bound, cumulative))
        yield HistogramMetricFamily(
            _metric_name(histogram.value) + "_seconds",
            (histogram.__doc__ or "").strip(),
            buckets=buckets,
            sum_value=snapshot.sum,
        )


class _Collector:
    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Any]:
        yield from _families(self._metrics)


def prometheus_available() -> bool:
    """Whether ``prometheus-client`` can be imported, so that ``/metrics`` can answer."""
    try:
        import prometheus_client  # noqa: F401, PLC0415 - optional extra
    except ImportError:
        return False
    return True


def prometheus_text(metrics: Metrics) -> bytes:
    """``metrics`` in the Prometheus text exposition format.

    Raises :class:`ImportError` naming the extra when ``prometheus-client``
    is not installed.
    """
    try:
        from prometheus_client import CollectorRegistry, generate_latest  # noqa: PLC0415
    except ImportError as exc:
        raise ImportError(METRICS_UNAVAILABLE) from exc
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(metrics))
    return generate_latest(registry)


# -- the server ---------------------------------------------------------------------


class MetricsServer:
    """``/metrics``, ``/livez`` (``/healthz``) and ``/readyz`` on ``host:port``.

    :attr:`metrics` is the worker's :class:`~pubsub_worker.Metrics` once it
    built them (``/metrics`` answers 503 until then). Without
    ``prometheus-client`` ``/metrics`` answers 501 (:data:`METRICS_UNAVAILABLE`)
    and the probes answer all the same. Port 0 picks a free port:
    :attr:`port` says which. :meth:`start` and :meth:`stop` are idempotent.
    """

    def __init__(
        self,
        health: Health,
        metrics: Metrics | None = None,
        *,
        port: int,
        host: str = DEFAULT_HOST,
    ) -> None:
        self.health = health
        self.metrics = metrics
        """What ``/metrics`` exports; set it once the worker has built its runtime."""
        self._lock = threading.Lock()  # guards _server and _thread
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._host = host
        self._port = port
        # Looked up once: whether the extra is installed does not change while a worker runs.
        self._exports = prometheus_available()

    @property
    def port(self) -> int:
        """The port served (the one chosen when 0 was asked for, once started)."""
        server = self._server
        return int(server.server_address[1]) if server is not None else self._port

    def start(self) -> None:
        """Bind and serve in a daemon thread; ``OSError`` when the port is taken."""
        with self._lock:
            if self._server is not None:
                return
            server = ThreadingHTTPServer((self._host, self._port), _handler_for(self))
            server.daemon_threads = True
            self._server = server
            self._thread = threading.Thread(
                target=server.serve_forever,
                kwargs={"poll_interval": 0.2},
                name="pubsub-worker-metrics",
                daemon=True,
            )
            self._thread.start()
        if self._exports:
            _LOGGER.info(
                "serving /metrics, /livez and /readyz on http://%s:%d", self._host, self.port
            )
        else:
            _LOGGER.warning(
                "serving /livez and /readyz on http://%s:%d; /metrics answers 501, it needs "
                "prometheus-client: %s",
                self._host,
                self.port,
                _INSTALL,
            )

    def stop(self) -> None:
        """Stop serving and close the socket."""
        with self._lock:
            server, thread = self._server, self._thread
            self._server = self._thread = None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if thread is not None:
            thread.join(timeout=5)

    def answer(self, path: str) -> tuple[int, str, bytes]:
        """``(status, content type, body)`` for a GET of ``path``."""
        route = path.split("?", 1)[0]
        if route in ("/livez", "/healthz"):
            return _probe(*self.health.live())
        if route == "/readyz":
            return _probe(*self.health.ready())
        if route == "/metrics":
            if not self._exports:
                return _text(501, METRICS_UNAVAILABLE + "\n")
            metrics = self.metrics
            if metrics is None:
                return _text(503, "starting: no metrics yet\n")
            try:
                body = prometheus_text(metrics)
            except ImportError as exc:
                return _text(501, f"{exc}\n")
            return 200, "text/plain; version=0.0.4; charset=utf-8", body
        return _text(404, "not found: /metrics, /livez, /healthz, /readyz\n")


def _probe(ok: bool, reason: str) -> tuple[int, str, bytes]:
    return _text(200 if ok else 503, reason + "\n")


def _text(status: int, text: str) -> tuple[int, str, bytes]:
    return status, "text/plain; charset=utf-8", text.encode("utf-8", "replace")


def _handler_for(server: MetricsServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            try:
                status, content_type, body = server.answer(self.path)
            except Exception:  # a broken gauge must not take the endpoint down
                _LOGGER.exception("the metrics endpoint failed to answer %s", self.path)
                status, content_type, body = _text(500, "internal error\n")
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            # Probes come every few seconds: keep them out of the worker's log.
            _LOGGER.debug("metrics endpoint: " + format, *args)

    return Handler
