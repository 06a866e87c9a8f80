"""Tasks, the same locally and in CI: tests, lint, typecheck, samples, bench, demo."""

from __future__ import annotations

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "typecheck", "tests", "samples"]
nox.options.reuse_venv = "yes"

PYPROJECT = nox.project.load_toml("pyproject.toml")
PASSTHROUGH = ("CI", "EMULATOR_BACKEND", "EMULATOR_SDK_ROOT")


def _install(session: nox.Session, *groups: str) -> None:
    deps = [dep for group in groups for dep in nox.project.dependency_groups(PYPROJECT, group)]
    session.install("-e", ".", *deps)


@nox.session
def demo(session: nox.Session) -> None:
    """Start the local emulators, publish a few jobs and run the sample worker on them."""
    _install(session)
    session.run("python", "-m", "samples.attachment_worker.demo", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite against the real emulators (started by the emulator package).

    Four pytest workers by default (``-n 0`` for one process): the crash-window
    tests mostly wait for leases to lapse, so they overlap well even on two cores.
    Each worker starts its own pair of emulators.
    """
    _install(session, "test")
    parallel = (
        []
        if any(arg.startswith(("-n", "--numprocesses")) for arg in session.posargs)
        else ["-n", "4"]
    )
    session.run(
        "pytest",
        *parallel,
        "--junitxml=.nox/junit-tests.xml",
        *session.posargs,
        env={"PYTHONFAULTHANDLER": "1"},
    )


@nox.session
def samples(session: nox.Session) -> None:
    """Run every sample end to end against the local emulators."""
    _install(session, "test")
    session.run("pytest", "samples", "-m", "emulator", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: lint and format check."""
    session.install(*nox.project.dependency_groups(PYPROJECT, "lint"))
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the library, emulator harness, samples, benchmarks and tests."""
    _install(session, "typecheck")
    session.run("mypy", "--strict", "pubsub_worker", "emulator", "samples", "benchmarks", "tests")


@nox.session
def bench(session: nox.Session) -> None:
    """Throughput and memory of the wrapper vs the stock client, in the same run."""
    _install(session, "test", "bench")
    session.run("python", "-m", "benchmarks.run", *session.posargs)


@nox.session
def chaos(session: nox.Session) -> None:
    """Workers killed, frozen and cut off under seeded faults; every effect counted.

    ``nox -s chaos`` is the full run (4 workers x 2,000 jobs); ``nox -s chaos --
    --short --seed 42,random --parallel`` the CI one. Exits 1 when an invariant fails.
    """
    _install(session, "test")
    session.run("python", "-m", "benchmarks.chaos", *session.posargs)
