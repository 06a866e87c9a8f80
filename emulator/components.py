"""Find the emulator components of the Google Cloud CLI and the Java runtime.

The emulators are Java programs shipped as CLI components under the SDK's
``platform/`` folder::

    <sdk>/platform/pubsub-emulator/lib/cloud-pubsub-emulator-<version>-all.jar
    <sdk>/platform/cloud-firestore-emulator/cloud-firestore-emulator.jar

Their launchers only build a ``java`` command line (the Firestore one as a
shell script that keeps running as Java's parent), so the harness builds the
same command itself and runs Java directly: one process per emulator, which
is the process that gets stopped.

The SDK is looked up, first match wins, in ``EMULATOR_SDK_ROOT`` (used alone
when set), ``CLOUDSDK_ROOT_DIR``, the folder of ``gcloud`` on ``PATH`` (after
resolving symlinks), then common install locations. Java is ``$JAVA``,
``$JAVA_HOME/bin/java`` or ``java`` on ``PATH``.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from emulator.errors import EmulatorNotInstalled

__all__ = [
    "MIN_JAVA_MAJOR",
    "Components",
    "find_components",
    "firestore_command",
    "pubsub_command",
]

MIN_JAVA_MAJOR = 17
"""Oldest Java major version the harness starts the emulators with."""

SDK_ROOT_ENV = "EMULATOR_SDK_ROOT"

PUBSUB_APT = "google-cloud-cli-pubsub-emulator"
FIRESTORE_APT = "google-cloud-cli-firestore-emulator"
JAVA_APT = "openjdk-17-jre-headless"

_PUBSUB_LIB = Path("platform", "pubsub-emulator", "lib")
_PUBSUB_JAR_GLOB = "cloud-pubsub-emulator-*.jar"
_FIRESTORE_JAR = Path("platform", "cloud-firestore-emulator", "cloud-firestore-emulator.jar")
_FIRESTORE_MAIN = "com.google.cloud.datastore.emulator.firestore.CloudFirestore"

_COMMON_SDK_ROOTS = (
    "/usr/lib/google-cloud-sdk",
    "/usr/share/google-cloud-sdk",
    "/opt/google-cloud-sdk",
    "/opt/google-cloud-cli",
    "/usr/local/share/google-cloud-sdk",
    "/opt/homebrew/share/google-cloud-sdk",
    "/snap/google-cloud-cli/current",
    "~/google-cloud-sdk",
)


@dataclass(frozen=True)
class Components:
    """Paths of what the subprocess backend runs.

    Attributes:
        sdk_root: The Google Cloud CLI folder the jars were found in.
        java: The Java executable.
        pubsub_jar: The Pub/Sub emulator jar, if it was asked for.
        firestore_jar: The Firestore emulator jar, if it was asked for.
    """

    sdk_root: Path
    java: Path
    pubsub_jar: Path | None
    firestore_jar: Path | None


def _candidate_roots(environ: Mapping[str, str]) -> list[Path]:
    explicit = environ.get(SDK_ROOT_ENV)
    if explicit:
        return [Path(explicit).expanduser()]
    roots: list[Path] = []
    if environ.get("CLOUDSDK_ROOT_DIR"):
        roots.append(Path(environ["CLOUDSDK_ROOT_DIR"]).expanduser())
    gcloud = shutil.which("gcloud", path=environ.get("PATH"))
    if gcloud:
        roots.append(Path(gcloud).resolve().parent.parent)
    roots.extend(Path(p).expanduser() for p in _COMMON_SDK_ROOTS)
    unique: list[Path] = []
    for root in roots:
        if root not in unique:
            unique.append(root)
    return unique


def _pubsub_jar(root: Path) -> Path | None:
    jars = sorted((root / _PUBSUB_LIB).glob(_PUBSUB_JAR_GLOB))
    return jars[-1] if jars else None


def _firestore_jar(root: Path) -> Path | None:
    jar = root / _FIRESTORE_JAR
    return jar if jar.is_file() else None


def _java_major(java: Path) -> int | None:
    """Read the major version from the JDK's ``release`` file (no JVM start)."""
    release = java.resolve().parent.parent / "release"
    try:
        text = release.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    match = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', text, re.MULTILINE)
    if match is None:
        return None
    major = int(match.group(1))
    # Java 8 and older call themselves 1.x.
    return int(match.group(2) or 0) if major == 1 else major


def _find_java(environ: Mapping[str, str]) -> Path:
    hint = (
        f"Install a Java {MIN_JAVA_MAJOR}+ runtime (for example "
        f"`apt-get install {JAVA_APT}`), or set JAVA_HOME or JAVA to one."
    )
    candidates: list[tuple[str, str]] = []
    if environ.get("JAVA"):
        candidates.append(("JAVA", environ["JAVA"]))
    if environ.get("JAVA_HOME"):
        candidates.append(("JAVA_HOME", str(Path(environ["JAVA_HOME"], "bin", "java"))))
    for source, value in candidates:
        found = shutil.which(value, path=environ.get("PATH"))
        if found is None:
            raise EmulatorNotInstalled(f"{source} points at {value!r}, which is not a Java. {hint}")
        return _checked_java(Path(found), hint)
    found = shutil.which("java", path=environ.get("PATH"))
    if found is None:
        raise EmulatorNotInstalled(f"The emulators need Java and none is on PATH. {hint}")
    return _checked_java(Path(found), hint)


def _checked_java(java: Path, hint: str) -> Path:
    major = _java_major(java)
    if major is not None and major < MIN_JAVA_MAJOR:
        raise EmulatorNotInstalled(f"{java} is Java {major}; the emulators need newer. {hint}")
    return java


def _missing_message(missing: Sequence[str], roots: Sequence[Path]) -> str:
    packages = {"Pub/Sub": PUBSUB_APT, "Firestore": FIRESTORE_APT}
    components = {"Pub/Sub": "pubsub-emulator", "Firestore": "cloud-firestore-emulator"}
    names = " and ".join(f"the {m} emulator" for m in missing)
    apt = " ".join(packages[m] for m in missing)
    gcloud = " ".join(components[m] for m in missing)
    searched = ", ".join(str(r) for r in roots)
    return (
        f"{names[0].upper()}{names[1:]} not found (searched: {searched}). "
        f"Install with `apt-get install {apt}` (Debian/Ubuntu packages of the Google "
        f"Cloud CLI) or `gcloud components install {gcloud}`, and a Java "
        f"{MIN_JAVA_MAJOR}+ runtime such as `{JAVA_APT}`; or set {SDK_ROOT_ENV} to a "
        f"Google Cloud CLI folder that has them; or set EMULATOR_BACKEND=docker to "
        f"run the emulator container image instead."
    )


def find_components(
    *, pubsub: bool = True, firestore: bool = True, environ: Mapping[str, str] | None = None
) -> Components:
    """Locate the requested emulator jars and a Java runtime.

    Args:
        pubsub: Whether the Pub/Sub emulator is needed.
        firestore: Whether the Firestore emulator is needed.
        environ: Environment to read (defaults to ``os.environ``).

    Raises:
        EmulatorNotInstalled: A requested component or Java is missing; the
            message names the packages to install.
    """
    env = os.environ if environ is None else environ
    roots = _candidate_roots(env)
    best: tuple[int, Path, Path | None, Path | None] | None = None
    for root in roots:
        ps_jar = _pubsub_jar(root) if pubsub else None
        fs_jar = _firestore_jar(root) if firestore else None
        found = (ps_jar is not None) + (fs_jar is not None)
        if best is None or found > best[0]:
            best = (found, root, ps_jar, fs_jar)
        if (ps_jar is not None or not pubsub) and (fs_jar is not None or not firestore):
            return Components(root, _find_java(env), ps_jar, fs_jar)
    missing: list[str] = []
    if pubsub and (best is None or best[2] is None):
        missing.append("Pub/Sub")
    if firestore and (best is None or best[3] is None):
        missing.append("Firestore")
    raise EmulatorNotInstalled(_missing_message(missing, roots))


def pubsub_command(components: Components, host: str, port: int) -> list[str]:
    """Return the Java command line of the Pub/Sub emulator on ``host:port``."""
    if components.pubsub_jar is None:
        raise EmulatorNotInstalled(_missing_message(["Pub/Sub"], [components.sdk_root]))
    return [
        str(components.java),
        "-jar",
        str(components.pubsub_jar),
        f"--host={host}",
        f"--port={port}",
    ]


def firestore_command(components: Components, host: str, port: int) -> list[str]:
    """Return the Java command line of the Firestore emulator on ``host:port``.

    Same flags as the CLI's ``cloud_firestore_emulator`` script, without the
    shell in between.
    """
    if components.firestore_jar is None:
        raise EmulatorNotInstalled(_missing_message(["Firestore"], [components.sdk_root]))
    return [
        str(components.java),
        "-Duser.language=en",
        "-cp",
        str(components.firestore_jar),
        _FIRESTORE_MAIN,
        f"--host={host}",
        f"--port={port}",
    ]
