"""Tasks, the same locally and in CI: tests, compat, lint, typecheck, samples, docs, bench, demo."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import nox

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.sessions = ["lint", "typecheck", "tests", "samples"]
nox.options.reuse_venv = "yes"

PYPROJECT = nox.project.load_toml("pyproject.toml")
PASSTHROUGH = ("CI", "EMULATOR_BACKEND", "EMULATOR_SDK_ROOT")

# The supported Pythons other than the one the whole suite runs on (3.11).
COMPAT_PYTHONS = ["3.10", "3.12", "3.13"]


def _pyenv(*args: str) -> str | None:
    pyenv = shutil.which("pyenv")
    if pyenv is None:
        return None
    result = subprocess.run([pyenv, *args], capture_output=True, text=True, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def _activate_pyenv_versions(wanted: list[str]) -> None:
    """Make pyenv's installed interpreters of the ``wanted`` versions findable by nox.

    pyenv's shims run only the versions it has active: with ``pyenv global 3.11.7``,
    ``python3.10`` answers "command not found" although 3.10.13 is installed, and nox's
    interpreter discovery (the same for its uv and virtualenv backends) resolves a shim
    through the active versions only. It would then download an interpreter, which CI
    cannot do. So the newest installed patch release of each wanted version that is not
    active yet is appended to ``PYENV_VERSION``, after the active ones: ``python`` and
    ``python3`` stay what they were. Without pyenv this does nothing.
    """
    root = os.environ.get("PYENV_ROOT") or _pyenv("root")
    active = os.environ.get("PYENV_VERSION") or _pyenv("version-name")
    if not active and root and (Path(root) / "version").is_file():
        active = ":".join((Path(root) / "version").read_text(encoding="utf-8").split())
    if not root or not active:
        return
    versions = active.split(":")
    installed: dict[str, tuple[int, str]] = {}
    for entry in (Path(root) / "versions").glob("*"):
        match = re.fullmatch(r"(\d+\.\d+)\.(\d+)", entry.name)
        if match and (entry / "bin").is_dir():
            minor, patch = match.group(1), int(match.group(2))
            if patch >= installed.get(minor, (-1, ""))[0]:
                installed[minor] = (patch, entry.name)
    for minor in wanted:
        covered = any(version == minor or version.startswith(f"{minor}.") for version in versions)
        if not covered and minor in installed:
            versions.append(installed[minor][1])
    os.environ["PYENV_VERSION"] = ":".join(versions)


_activate_pyenv_versions(COMPAT_PYTHONS)


def _install(session: nox.Session, *groups: str) -> None:
    deps = [dep for group in groups for dep in nox.project.dependency_groups(PYPROJECT, group)]
    session.install("-e", ".", *deps)


@nox.session
def demo(session: nox.Session) -> None:
    """Start the local emulators, publish a few jobs and run the sample worker on them."""
    _install(session)
    session.run("python", "-m", "samples.attachment_worker.demo", *session.posargs)


@nox.session(name="ui-demo")
def ui_demo(session: nox.Session) -> None:
    """The demo, then its worker and emulators kept running for ``pubsub-worker ui`` (docs/ui.md).

    The dashboard is installed here too: ``.nox/ui-demo/bin/pubsub-worker ui --allow-actions``.
    """
    session.install("-e", ".[ui]")
    session.run("python", "-m", "samples.attachment_worker.ui_demo", *session.posargs)


@nox.session
def tests(session: nox.Session) -> None:
    """The whole suite against the real emulators (started by the emulator package).

    Four pytest workers by default (``-n 0`` for one process): the crash-window
    tests mostly wait for leases to lapse, so they overlap well even on two cores;
    an idle worker takes queued tests from a busy one (``--dist worksteal``), so the
    long chaos tests do not queue behind each other on one worker.
    Each worker starts its own pair of emulators.
    """
    _install(session, "test")
    parallel = (
        []
        if any(arg.startswith(("-n", "--numprocesses")) for arg in session.posargs)
        else ["-n", "4", "--dist", "worksteal"]
    )
    session.run(
        "pytest",
        *parallel,
        "--junitxml=.nox/junit-tests.xml",
        *session.posargs,
        env={"PYTHONFAULTHANDLER": "1"},
    )


@nox.session(python=COMPAT_PYTHONS)
def compat(session: nox.Session) -> None:
    """Unit and contract tests on the other supported Pythons (the whole suite runs on 3.11).

    ``nox -s compat`` runs 3.10, 3.12 and 3.13 in turn, ``nox -s compat-3.10`` one of
    them. The contract tests run every store against the real emulators, which the
    pytest plugin starts (one pair, in one pytest process).
    """
    _install(session, "test")
    session.run(
        "pytest",
        "-n",
        "0",
        f"--junitxml=.nox/junit-compat-{session.python}.xml",
        "tests/unit",
        "tests/contract",
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
    """mypy --strict on the library, emulator harness, samples, benchmarks, model driver, tests."""
    _install(session, "typecheck")
    session.run(
        "mypy", "--strict", "pubsub_worker", "emulator", "samples", "benchmarks", "model", "tests"
    )


@nox.session
def model(session: nox.Session) -> None:
    """The protocol's Promela model checked by SPIN, then the long property-test profile.

    ``nox -s model`` checks every property of ``model/protocol.pml`` (docs/protocol.md);
    ``nox -s model -- --mutants`` also checks that SPIN refutes every named mutant of the
    protocol. Needs Debian's ``spin`` and ``gcc`` (SPIN's verifier is a C program).
    """
    missing = [tool for tool in ("spin", "gcc") if shutil.which(tool) is None]
    if missing:
        session.error(
            f"{' and '.join(missing)} not found: the model is checked by SPIN, whose verifier "
            "is built with gcc; install Debian's spin and gcc (apt-get install spin gcc)"
        )
    _install(session, "test")
    session.run("python", "model/check.py", *session.posargs)
    if not Path("tests/property").is_dir():
        session.log("tests/property does not exist: the long property-test profile is skipped")
        return
    session.run(
        "pytest",
        "-n",
        "0",
        "tests/property",
        "--hypothesis-profile=long",
        "-p",
        "no:cacheprovider",
        env={"PYTHONFAULTHANDLER": "1"},
    )


@nox.session
def docs(session: nox.Session) -> None:
    """The documentation site (docs/ and the API reference from the docstrings) in site/.

    Built with ``--strict``: a warning (a broken link or anchor, a page left out
    of the navigation, a docstring the reference cannot read) fails the build.
    ``nox -s docs -- serve`` serves it with live reload instead.
    """
    _install(session, "docs")
    quiet = {"NO_MKDOCS_2_WARNING": "1"}  # the theme's notice about its successor, not a warning
    if session.posargs[:1] == ["serve"]:
        session.run("mkdocs", "serve", "--strict", *session.posargs[1:], env=quiet)
        return
    session.run("mkdocs", "build", "--strict", *session.posargs, env=quiet)


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
