"""The project documents itself: every link in README.md and docs/ resolves inside the project
(a file of the repository, and a heading of it when the link names one), none points outside;
the README's first screen (title to its links) reads in a minute, with the two set-up commands
first; every ``goodtrace`` command line the pages show is a command with options it has."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, flags=re.M)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_resolve_inside_the_project(page: Path) -> None:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            bad.append(f"{target}: points outside the project")
            continue
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists() or (ROOT not in linked.parents and linked != ROOT):
            bad.append(f"{target}: no such file in the project")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            bad.append(f"{target}: no heading #{anchor} in {linked.relative_to(ROOT)}")
    assert not bad, f"{page.relative_to(ROOT)}:\n" + "\n".join(bad)


DOCS = ("docs/semantics.md", "docs/architecture.md", "docs/recording.md", "docs/integrations.md", "docs/sinks.md",
        "docs/reading-at-scale.md", "docs/cli.md", "docs/development.md")


def _first_screen() -> list[str]:
    """The README from its title to the end of its links (the section after "## Read on")."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    links = lines.index("## Read on")
    end = next((i for i in range(links + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return lines[:end]


def test_readme_names_the_documents() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    screen = "\n".join(_first_screen())
    for doc in DOCS:
        assert (ROOT / doc).exists() and f"]({doc})" in readme, doc
    for doc in DOCS[:-1]:  # the usage pages and the references, linked from the first screen
        assert f"]({doc})" in screen, doc


def test_the_readme_first_screen_reads_in_a_minute() -> None:
    screen = _first_screen()
    assert len(screen) < 60, f"the README's first screen is {len(screen)} lines"
    assert screen[0] == "# goodtrace"
    # the title paragraph, then the two set-up commands (CI runs the second, grepped from here)
    fence = screen.index("```bash")
    assert all(line for line in screen[2:fence - 1]) and screen[fence - 1] == ""
    first, second, close = screen[fence + 1:fence + 4]
    assert first.startswith("python3 -m venv .venv && ") and first.endswith("goodtrace demo")
    assert second.startswith(".ci/system-deps && ") and close == "```"
    assert "```python" in screen and "goodtrace report" in "\n".join(screen)


def _command_lines() -> list[tuple[Path, str]]:
    """Every ``goodtrace ...`` line in the pages' shell blocks (comments cut)."""
    out = []
    for page in PAGES:
        for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), flags=re.S):
            for line in block.splitlines():
                for part in re.split(r"&&|;", line.split(" #", 1)[0]):
                    if part.strip().startswith("goodtrace "):
                        out.append((page, part.strip()))
    return out


def test_the_commands_the_pages_show_exist() -> None:
    from goodtrace.cli import build_parser

    parser = build_parser()
    commands = {action.dest: action for action in parser._actions}["command"].choices  # type: ignore[attr-defined]
    shown = _command_lines()
    assert {"report", "diff", "trace"} <= {shlex.split(line)[1] for _, line in shown}
    bad = []
    for page, line in shown:
        words = shlex.split(line)
        sub = commands.get(words[1])
        if sub is None:
            bad.append(f"{page.name}: {line}: no command {words[1]!r}")
            continue
        options = {o for action in sub._actions for o in action.option_strings}
        bad += [f"{page.name}: {line}: {words[1]} has no option {w}" for w in words[2:]
                if w.startswith("-") and w.split("=", 1)[0] not in options and not re.fullmatch(r"-\d.*", w)]
    assert not bad, "\n".join(bad)
