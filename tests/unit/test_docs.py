"""The README a new user reads first, and the API reference page, checked against the code.

The site itself is built with ``mkdocs build --strict`` (``nox -s docs``),
which fails on a broken link or anchor and on a page left out of the
navigation; this file checks what that build cannot know.
"""

from __future__ import annotations

import re
from pathlib import Path

import pubsub_worker

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _section(text: str, title: str) -> str:
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_readme_says_what_a_new_user_needs_in_order() -> None:
    assert re.findall(r"^## (.+)$", README, re.MULTILINE) == [
        "Install",
        "Quick start",
        "A first handler",
        "Wrapping an existing callback",
        "Push, in brief",
        "Performance",
        "Documentation",
    ]


def test_the_quick_start_is_exactly_two_commands_the_demo_then_the_tests() -> None:
    blocks = re.findall(r"```\n(.*?)```", _section(README, "Quick start"), re.DOTALL)
    assert blocks == ["make demo\nmake test\n"]


def test_the_install_line_names_every_extra() -> None:
    install = re.findall(r"```\n(.*?)```", _section(README, "Install"), re.DOTALL)
    assert install == ["pip install 'pubsub-exactly-once[push,prometheus,otel]'\n"]


def test_every_relative_link_of_the_readme_exists() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    relative = [link for link in links if "://" not in link]
    assert relative, "the README links to the documentation"
    assert [link for link in relative if not (ROOT / link).exists()] == []


def test_the_api_reference_covers_every_public_name() -> None:
    page = (ROOT / "docs" / "reference.md").read_text(encoding="utf-8")
    documented = re.findall(r"^::: pubsub_worker\.(\S+)$", page, re.MULTILINE)
    assert len(documented) == len(set(documented))
    assert set(pubsub_worker.__all__) <= set(documented)
    assert "push.create_app" in documented


def test_every_page_is_in_the_sites_navigation() -> None:
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    listed = set(re.findall(r":\s*([\w-]+\.md)$", config, re.MULTILINE))
    assert listed == {path.name for path in (ROOT / "docs").glob("*.md")}
