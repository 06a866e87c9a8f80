"""MkDocs hook: the Sphinx roles of the docstrings, shown as the code they name.

The library's docstrings cross-reference with Sphinx roles (``:class:`~pkg.Name```),
which the API reference renders literally (``:class:`` before the code). This
drops the role, and a leading ``~`` keeps only the last part of the dotted name,
as Sphinx shows it.
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(r":(?:class|func|meth|mod|attr|data|exc|obj|const):<code>(~?)([^<]*)</code>")


def _shown(match: re.Match[str]) -> str:
    name = match.group(2)
    return f"<code>{name.rsplit('.', 1)[-1] if match.group(1) else name}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    """The page's HTML with every role dropped."""
    return _ROLE.sub(_shown, html)
