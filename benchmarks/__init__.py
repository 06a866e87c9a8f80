"""Throughput, latency and memory of the wrapper against the stock client, on the real emulators.

``python -m benchmarks.run`` (or ``nox -s bench``) runs every scenario in one
session, interleaved and repeated, and writes ``docs/benchmarks.md`` and
``.nox/bench.json``. See :mod:`benchmarks.run` for the options.
"""
