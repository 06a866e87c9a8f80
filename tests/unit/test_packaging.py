"""What a published package carries: the wheel holds the library and the emulator harness only.

The wheel and the sdist are built from this tree by the build backend itself (hatchling's
PEP 517 hooks, what ``pip wheel --no-build-isolation`` calls), in well under a second.
"""

from __future__ import annotations

import email
import email.message
import importlib.metadata
import re
import subprocess
import sys
import tarfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import pubsub_worker
from pubsub_worker._support import distribution

ROOT = Path(__file__).resolve().parents[2]

BUILD = """
import sys
import hatchling.build

print(hatchling.build.build_wheel(sys.argv[1]))
print(hatchling.build.build_sdist(sys.argv[1]))
"""


class Built:
    """The wheel and sdist of this tree, built once for the module."""

    def __init__(self, directory: Path) -> None:
        # The backend is run in a child process: its cwd must be the project, and its
        # imports stay out of the test process.
        result = subprocess.run(
            [sys.executable, "-c", BUILD, str(directory)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert result.returncode == 0, result.stderr
        wheel_name, sdist_name = result.stdout.split()
        self.wheel = zipfile.ZipFile(directory / wheel_name)
        self.wheel_names = self.wheel.namelist()
        with tarfile.open(directory / sdist_name) as sdist:
            # Each member is "pubsub_exactly_once-0.1.0/<path>".
            members = sdist.getmembers()
            self.sdist_names = [m.name.split("/", 1)[1] for m in members if "/" in m.name]
        (self.dist_info,) = {
            name.split("/")[0] for name in self.wheel_names if ".dist-info/" in name
        }

    def read(self, name: str) -> str:
        return self.wheel.read(f"{self.dist_info}/{name}").decode()

    def metadata(self) -> email.message.Message:
        return email.message_from_string(self.read("METADATA"))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Built]:
    result = Built(tmp_path_factory.mktemp("dist"))
    yield result
    result.wheel.close()


def test_wheel_holds_the_library_and_the_emulator_harness_only(built: Built) -> None:
    top_level = {name.split("/")[0] for name in built.wheel_names}
    assert top_level == {"pubsub_worker", "emulator", built.dist_info}
    assert built.dist_info.startswith("pubsub_exactly_once-")
    assert not [name for name in built.wheel_names if name.endswith(".pyc")]


def test_the_distribution_has_a_name_of_its_own(built: Built) -> None:
    # "pubsub-worker" on the package index is another project: never publish or install it.
    assert built.metadata()["Name"] == distribution.NAME == "pubsub-exactly-once"
    assert distribution.install_line("push") == "pip install 'pubsub-exactly-once[push]'"
    deployed = (ROOT / "samples" / "push_function" / "requirements.txt").read_text()
    assert distribution.NAME in deployed.split()
    assert "pubsub-worker" not in deployed.split()


def test_wheel_holds_every_module_of_both_packages(built: Built) -> None:
    for package in ("pubsub_worker", "emulator"):
        on_disk = {
            path.relative_to(ROOT).as_posix()
            for path in (ROOT / package).rglob("*.py")
            if "__pycache__" not in path.parts
        }
        assert on_disk
        assert on_disk <= set(built.wheel_names), sorted(on_disk - set(built.wheel_names))


def test_wheel_holds_the_dashboard_s_templates_and_static_files(built: Built) -> None:
    ui = ROOT / "pubsub_worker" / "ui"
    data = {
        path.relative_to(ROOT).as_posix()
        for folder in ("templates", "static")
        for path in (ui / folder).iterdir()
    }
    assert {"pubsub_worker/ui/static/htmx.min.js", "pubsub_worker/ui/static/ui.css"} <= data
    assert "pubsub_worker/ui/templates/base.html" in data
    assert data <= set(built.wheel_names), sorted(data - set(built.wheel_names))


def test_the_ui_extra_brings_what_the_dashboard_imports(built: Built) -> None:
    requires = built.metadata().get_all("Requires-Dist") or []
    ui = sorted(r.split(";")[0].split(">")[0].strip() for r in requires if "extra == 'ui'" in r)
    assert ui == ["jinja2", "requests", "starlette", "uvicorn"]


def test_wheel_is_typed(built: Built) -> None:
    assert "pubsub_worker/py.typed" in built.wheel_names
    assert "emulator/py.typed" in built.wheel_names


def test_wheel_declares_the_console_script_and_the_pytest_plugin(built: Built) -> None:
    entry_points = built.read("entry_points.txt")
    sections: dict[str, dict[str, str]] = {}
    section: dict[str, str] = {}
    for raw in entry_points.splitlines():
        line = raw.strip()
        if line.startswith("["):
            section = sections.setdefault(line.strip("[]"), {})
        elif "=" in line:
            name, _, target = line.partition("=")
            section[name.strip()] = target.strip()
    assert sections == {
        "console_scripts": {"pubsub-worker": "pubsub_worker.cli:main"},
        "pytest11": {"pubsub_worker_emulator": "emulator.pytest_plugin"},
    }


def test_metadata_names_python_versions_urls_and_typing(built: Built) -> None:
    metadata = built.metadata()
    assert metadata["Requires-Python"] == ">=3.10"
    classifiers = metadata.get_all("Classifier") or []
    for version in ("3.10", "3.11", "3.12", "3.13"):
        assert f"Programming Language :: Python :: {version}" in classifiers
    assert "Typing :: Typed" in classifiers
    assert "Framework :: Pytest" in classifiers
    urls: dict[str, str] = {}
    for entry in metadata.get_all("Project-URL") or []:
        label, _, url = entry.partition(",")
        urls[label.strip()] = url.strip()
    assert {"Homepage", "Documentation", "Changelog", "Issues"} <= set(urls)
    for label, url in urls.items():
        assert url.startswith("https://github.com/pubsub-worker/pubsub-worker"), (label, url)


def test_sdist_carries_tests_samples_benchmarks_and_docs(built: Built) -> None:
    top_level = {name.split("/")[0] for name in built.sdist_names}
    for wanted in (
        "pubsub_worker",
        "emulator",
        "samples",
        "benchmarks",
        "tests",
        "docs",
        ".ci",
        "README.md",
        "CHANGELOG.md",
        "noxfile.py",
        "Makefile",
        "mkdocs.yml",
        "pyproject.toml",
    ):
        assert wanted in top_level, wanted
    assert "tests/unit/test_packaging.py" in built.sdist_names
    assert not [name for name in built.sdist_names if "__pycache__" in name]


def _pyproject_version() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    match = re.search(r'^version = "([^"]+)"$', text, re.MULTILINE)
    assert match is not None
    return match.group(1)


def test_version_is_the_distributions(built: Built) -> None:
    assert built.metadata()["Version"] == _pyproject_version()
    assert pubsub_worker.__version__ == importlib.metadata.version("pubsub-exactly-once")
    assert pubsub_worker.__version__ == _pyproject_version()


def test_version_without_an_install_is_pyprojects(monkeypatch: pytest.MonkeyPatch) -> None:
    def not_installed(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", not_installed)
    assert distribution.installed_version() == _pyproject_version()
