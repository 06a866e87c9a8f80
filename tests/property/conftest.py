"""Hypothesis profiles of the property tests: ``ci`` unless the command line chooses one.

``ci`` (the default) is reproducible and bounded: a fixed seed
(``derandomize``), few enough examples that this directory runs in well
under a minute on two busy cores, no per-example deadline (the emulator's
round trips vary with the machine's load), and the blob to reproduce a
failure printed. ``long`` explores: random seeds and ten times the examples (about three
minutes on two quiet cores), for
``pytest tests/property --hypothesis-profile=long`` (``nox -s model``). Its tests
get :data:`LONG_TIMEOUT_S` each instead of the suite's two minutes: the
emulators' lockstep test alone took five and a half minutes on a loaded
machine, where the suite's timeout stopped it mid-example (and hypothesis then
reported the interrupted run as flaky data generation).

Hypothesis's pytest plugin loads the profile named by ``--hypothesis-profile``
when pytest starts, so this file must have registered it by then: give pytest
``tests/property`` (or a file in it) as an argument, which makes this an
initial conftest, loaded before the plugin reads the option.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

CI_EXAMPLES = 100
"""Examples per pure property under ``ci``; the tests on the emulator run a fraction."""

settings.register_profile(
    "ci", derandomize=True, max_examples=CI_EXAMPLES, deadline=None, print_blob=True
)
settings.register_profile(
    "long", derandomize=False, max_examples=10 * CI_EXAMPLES, deadline=None, print_blob=True
)
if settings.get_current_profile_name() == "default":
    settings.load_profile("ci")

LONG_TIMEOUT_S = 1800
"""Each test's timeout under ``long``: a hang, not a slow machine, is what it catches."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if settings.get_current_profile_name() != "long":
        return
    here = Path(__file__).parent
    for item in items:
        if here in item.path.parents:
            item.add_marker(pytest.mark.timeout(LONG_TIMEOUT_S), append=False)
