"""The pytest plugin itself: skip locally, fail in CI, automatic marker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

INNER_TEST = """
def test_needs_emulators(emulators):
    raise AssertionError("must not run without emulators")

def test_plain():
    pass
"""


def _run_inner(tmp_path: Path, *args: str, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_inner.py").write_text(INNER_TEST)
    env = {**os.environ, "EMULATOR_SDK_ROOT": str(tmp_path / "no-sdk")}
    env["EMULATOR_BACKEND"] = "subprocess"
    env.pop("CI", None)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize("ci", [None, "false", "0"])
def test_missing_emulators_skip_locally(tmp_path: Path, ci: str | None) -> None:
    result = _run_inner(tmp_path, ci=ci)
    assert result.returncode == 0, result.stdout
    assert "1 passed, 1 skipped" in result.stdout
    assert "emulators unavailable" in result.stdout
    assert "apt-get install" in result.stdout


@pytest.mark.parametrize("ci", ["true", "1"])
def test_missing_emulators_fail_in_ci(tmp_path: Path, ci: str) -> None:
    result = _run_inner(tmp_path, ci=ci)
    assert result.returncode == 1, result.stdout
    assert "1 passed, 1 error" in result.stdout
    assert "emulators unavailable" in result.stdout


def test_tests_using_emulators_get_the_marker(tmp_path: Path) -> None:
    result = _run_inner(tmp_path, "-m", "not emulator", "--strict-markers", ci="true")
    assert result.returncode == 0, result.stdout
    assert "1 passed, 1 deselected" in result.stdout
