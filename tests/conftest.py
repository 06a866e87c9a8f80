"""Suite-wide hooks."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, Any, None]:
    """Escape lone surrogates in a report's captured output.

    Tests feed hostile keys (lone surrogates included) through the logging;
    pytest-xdist cannot send a report holding text that is not valid UTF-8
    to the controller, so what was captured is shown escaped instead.
    """
    outcome = yield
    report = outcome.get_result()
    report.sections = [(title, _escaped(text)) for title, text in report.sections]


def _escaped(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
