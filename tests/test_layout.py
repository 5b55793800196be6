"""The layout docs/architecture.md draws is the package's: every module is named there, every
name there exists, and no module grows past 450 lines (a file that does one job stays short)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "marlhf_cli"
MAX_LINES = 450


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "samples" not in p.parts)


def _drawn_tree() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    return re.search(r"```\nmarlhf_cli/\n(.*?)```", text, re.S).group(1)


def test_no_module_is_over_the_limit():
    long = {str(p.relative_to(ROOT)): n for p in _modules() if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"split these along their concerns: {long}"


def test_architecture_names_every_module():
    drawn = set(re.findall(r"\b([a-z_]+\.py)\b", _drawn_tree()))
    # data/ is drawn as a family (one adapter per dataset); packages' __init__ files as their folder
    missing = sorted(
        str(p.relative_to(PACKAGE)) for p in _modules()
        if p.name != "__init__.py" and p.parent.name != "data" and p.name not in drawn
    )  # fmt: skip
    assert not missing, f"docs/architecture.md does not draw {missing}"
    assert re.search(r"\bassets/", _drawn_tree()), "assets/ (the shipped tokenizer) is not drawn"
    folders = {p.parent.relative_to(PACKAGE).as_posix() for p in _modules()} - {"."}
    for folder in folders:
        assert re.search(rf"\b{re.escape(folder.split('/')[-1])}/", _drawn_tree()), f"{folder}/ is not drawn"


def test_architecture_names_nothing_that_is_gone():
    existing = {p.name for p in _modules()}
    stale = sorted(set(re.findall(r"\b([a-z_]+\.py)\b", _drawn_tree())) - existing)
    assert not stale, f"docs/architecture.md draws modules that do not exist: {stale}"


def test_only_the_cli_reaches_into_the_evaluations():
    """marlhf_cli/evaluate/ (bon, judge) sits on top: the stages, the data and chat layers
    below it never import it (chat.py once did, for resolve_policy, now RunDir.policy)."""
    pattern = re.compile(r"^\s*(from\s+(\.+|marlhf_cli\.)evaluate\b|import\s+marlhf_cli\.evaluate\b)", re.M)
    reaching = sorted(
        str(p.relative_to(PACKAGE)) for p in _modules()
        if "evaluate" not in p.relative_to(PACKAGE).parts and p.name != "cli.py" and pattern.search(p.read_text(encoding="utf-8"))
    )  # fmt: skip
    assert not reaching, f"these import marlhf_cli.evaluate from below it: {reaching}"
