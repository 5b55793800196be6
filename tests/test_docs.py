"""The documentation tells the truth: the console examples of the README and the docs pages
print what they show, every citation of the method names a section of docs/method.md, the
CLI reference is what the commands generate, and the site builds with every link whole."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
METHOD = ROOT / "docs" / "method.md"
PAGES = sorted((ROOT / "docs").rglob("*.md"))
CLI_REFERENCE = ROOT / "docs" / "reference" / "cli.md"


def console_examples(text: str) -> list[list[tuple[str, str]]]:
    """Each ```console block as [(command, the output shown under it)]."""
    blocks = []
    for body in re.findall(r"```console\n(.*?)```", text, re.S):
        steps: list[tuple[str, list[str]]] = []
        for line in body.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            else:
                assert steps, f"output before any command in a console block: {line!r}"
                steps[-1][1].append(line)
        blocks.append([(command, "\n".join(lines)) for command, lines in steps])
    return blocks


# (the generated CLI reference's console blocks are usage lines, not examples)
EXAMPLES = [block for path in (README, *PAGES) if path != CLI_REFERENCE for block in console_examples(path.read_text(encoding="utf-8"))]


def test_readme_has_console_examples():
    assert EXAMPLES and all(EXAMPLES)
    assert any(command.startswith("marlhf segment") for block in EXAMPLES for command, _ in block)


@pytest.mark.parametrize("block", EXAMPLES, ids=[f"block{i}" for i in range(len(EXAMPLES))])
def test_readme_console_example_prints_what_it_shows(block, tmp_path):
    """Run each command of the block in order, in one shell, and compare its stdout."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "COLUMNS": "100"}
    prelude = f'marlhf() {{ "{sys.executable}" -m marlhf_cli.cli "$@"; }}\n'
    for command, shown in block:
        result = subprocess.run(
            ["bash", "-c", prelude + command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        assert result.returncode == 0, f"$ {command}\n{result.stderr[-2000:]}"
        assert result.stdout.rstrip() == shown.rstrip(), f"$ {command}"


def _headings() -> set[str]:
    return set(re.findall(r"^## (.+)$", METHOD.read_text(encoding="utf-8"), re.M))


def _sources() -> list[Path]:
    files = [README, *(p for p in PAGES if p != METHOD)]
    for folder in ("marlhf_cli", "tests", "benchmarks"):
        files += sorted(p for p in (ROOT / folder).rglob("*.py") if p.name != "test_docs.py")
    return files


def test_method_citations_name_sections_of_docs_method():
    headings = _headings()
    assert {"Rollout quantities", "Termination rules", "Segment GAE", "Losses", "Program rewards"} <= headings
    cited = 0
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        for match in re.finditer(r"docs/method\.md((?:(?:,| and)? ?[\"'][^\"'\n]+[\"'])+)", text):
            for name in re.findall(r"[\"']([^\"'\n]+)[\"']", match.group(1)):
                assert name in headings, f"{path.relative_to(ROOT)} cites docs/method.md '{name}', which has no such section"
                cited += 1
    assert cited >= 20


def test_nothing_cites_a_document_the_repository_lacks():
    for path in _sources():
        assert "ma-ppo.md" not in path.read_text(encoding="utf-8"), path.relative_to(ROOT)


def test_help_texts_cite_the_method_document():
    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    out = CliRunner().invoke(app, ["ppo", "--help"], env={"COLUMNS": "200"}).output
    assert "docs/method.md, 'Program rewards'" in " ".join(out.split())


def _readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.*?)\n```", README.read_text(encoding="utf-8"), re.S)[:2]


def test_the_readme_opens_with_what_ci_runs():
    """The two commands at the top are CI's (.ci/run): the install steps in the same order, then the tests."""
    install, tests = _readme_commands()
    assert tests == ".venv/bin/python -m pytest -q -n auto --maxprocesses 4"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    steps = [line.split(".venv/bin/", 1)[1].replace(" -q", "") for line in ci.splitlines() if ".venv/bin/pip install" in line and "--upgrade pip" not in line]
    position = 0
    for step in steps:  # 'pip install "torch==2.13.0+cpu" ...', 'pip install -e ".[all]"', 'pip install --no-deps ...'
        found = install.find(step, position)
        assert found >= 0, f"README's first command lacks CI's step {step!r} (in order)"
        position = found + len(step)
    assert "marlhf sft --preset cpu-tiny && marlhf rm --preset cpu-tiny && marlhf ppo --preset cpu-tiny" in install


def test_the_first_command_installs_torchs_cpu_build_on_any_linux_machine():
    """PyPI's torch is the multi-GB CUDA build on Linux: the first command names the CPU build
    (its local version) and PyTorch's CPU index, and the README says what a GPU machine takes."""
    install, _ = _readme_commands()
    assert 'pip install "torch==2.13.0+cpu" --extra-index-url https://download.pytorch.org/whl/cpu &&' in install
    assert install.index("torch==2.13.0+cpu") < install.index('pip install -e ".[all]"')  # torch first
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert "On a GPU machine install the CUDA build instead, `pip install torch==2.13.0`" in text


def test_getting_started_installs_and_tests_as_the_readme_does():
    """The docs site's first page repeats the README's two commands: they cannot drift apart."""
    page = (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert re.findall(r"```bash\n(.*?)\n```", page, re.S)[:2] == _readme_commands()


def test_the_cli_reference_is_what_the_commands_generate(tmp_path):
    """docs/reference/cli.md is Typer's own rendering of the app, each command's options under
    the panels its --help shows (regenerate it with the command below after changing a command
    or a flag's help)."""
    out = tmp_path / "cli.md"
    done = subprocess.run([sys.executable, "-m", "marlhf_cli.help_panels", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.read_text(encoding="utf-8") == CLI_REFERENCE.read_text(encoding="utf-8"), (
        "docs/reference/cli.md is stale: python -m marlhf_cli.help_panels docs/reference/cli.md"
    )
    text = out.read_text(encoding="utf-8")
    ppo = text.split("## `marlhf ppo`")[1].split("## `marlhf")[0]
    assert ppo.index("**Data**:") < ppo.index("**Macro actions**:") < ppo.index("**Run**:") and "* `--termination" in ppo


def test_the_site_builds_strictly_with_every_page_in_its_nav(tmp_path):
    """mkdocs build --strict (as CI runs it): a broken link, a missing anchor or a page left
    out of the nav fails; nothing is fetched from the network."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()


def test_the_readme_fits_on_two_screens_and_links_every_page():
    """At most 150 lines; the rest lives on the docs site, and the README names each page
    (of the results, their index; the report pages are its sections)."""
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    linked = set(re.findall(r"\]\(docs/([^)#]+)\)", text))
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in PAGES}
    assert {p for p in pages if not p.startswith("results/")} - {"index.md"} | {"results/index.md"} <= linked
