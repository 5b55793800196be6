"""The layout docs/architecture.md draws is the package's: every module is named there, every
name there exists, and no module grows past 450 lines (a file that does one job stays short)."""

from __future__ import annotations

import ast
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


def _imports(path: Path, annotations: bool = False) -> set[str]:
    """The marlhf_cli modules ``path`` imports, at module level or inside a function (a lazy
    import is still a dependency), leaving out ``if TYPE_CHECKING:`` blocks (annotations
    only) unless ``annotations``."""
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    package = module.removesuffix(".__init__") if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only = set() if annotations else {
        id(inner) for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) for inner in ast.walk(node)
    }  # fmt: skip
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "marlhf_cli":
                for alias in node.names:  # `from . import x` names a module; `from .m import f` names m
                    found.add(f"{target}.{alias.name}" if _module_path(f"{target}.{alias.name}") else target)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "marlhf_cli")
    return found


def _module_path(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _graph(annotations: bool = False) -> dict[str, set[str]]:
    graph = {}
    for path in _modules():
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        graph[module] = {target.removesuffix(".__init__") for target in _imports(path, annotations)} - {module}
    return graph


def test_no_module_imports_itself_back():
    """No import circle anywhere in the package, lazy imports and annotation-only imports
    included (artifacts.py and provenance.py once imported each other; the sampler's three
    modules did too; ppo's estimators named the Context built from the plan that reads them,
    the sandbox's execution the Isolation type of the containment that runs it): a circle is
    two modules that are one concern, or a helper in the wrong one."""
    graph = _graph(annotations=True)
    circles, state = [], {}

    def visit(module, trail):
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                circles.append(trail[trail.index(target):] + [target])
            elif target not in state:
                visit(target, trail + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not circles, f"import circles: {circles}"


def test_the_sampler_sits_below_the_stages():
    """marlhf_cli/generation/ serves ppo, mc's continuations, bon and passk: it imports none of
    them, only the two leaves every stage shares (console.py to speak, encode.py to encode a
    prompt as sft does), and nothing outside train/ppo reaches into it."""
    graph = _graph()
    leaves = {"marlhf_cli.console", "marlhf_cli.encode"}
    above = {m: sorted(t for t in targets if not t.startswith("marlhf_cli.generation") and t not in leaves)
             for m, targets in graph.items() if m.startswith("marlhf_cli.generation")}  # fmt: skip
    assert not any(above.values()), f"the sampler imports from above it: {above}"
    assert graph["marlhf_cli.encode"] == set() and graph["marlhf_cli.console"] <= {"marlhf_cli.engine"}
    # nothing outside ppo reads it (bon once read ppo's reward interface, now scoring/'s)
    reaching = {m: sorted(t for t in targets if t.startswith("marlhf_cli.train.ppo"))
                for m, targets in graph.items() if not m.startswith("marlhf_cli.train.ppo") and m != "marlhf_cli.cli"}  # fmt: skip
    assert not any(reaching.values()), f"these reach into train/ppo: {reaching}"


def test_reward_scoring_sits_below_the_stages_and_the_evaluations():
    """marlhf_cli/scoring/ (the reward interface, the reward model's and the critic's heads)
    serves ppo, rm, bon, judge --rm and the program rewards: it imports none of them, only the
    sampler's text helpers and the leaves (evaluate/bon.py once reached into train/ppo for it)."""
    graph = _graph(annotations=True)
    allowed = ("marlhf_cli.scoring", "marlhf_cli.generation", "marlhf_cli.errors")
    above = {m: sorted(t for t in targets if not t.startswith(allowed))
             for m, targets in graph.items() if m.startswith("marlhf_cli.scoring")}  # fmt: skip
    assert above and not any(above.values()), f"scoring imports from above it: {above}"


def test_ppo_resolves_what_a_run_is_once():
    """The estimator, the termination rule and K are read from the raw options in one place,
    settings.plan_run, into the RunPlan every part of the stage reads (before, run() went back
    and forth between settings.py and estimators.py, recomputing them at each stop)."""
    derivations = re.compile(r"make_rule\(|ESTIMATORS\[|\.samples_per_prompt\b|estimator_of\(|group_size\(config")
    places = sorted(
        f"{p.relative_to(PACKAGE)}:{number}" for p in _modules()
        for number, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if derivations.search(line) and not line.lstrip().startswith(("def ", "#", "ESTIMATORS[name] ="))  # registering
    )  # fmt: skip
    settings = (PACKAGE / "train" / "ppo" / "settings.py").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(settings, 1) if line.startswith("def plan_run("))
    end = next(i for i, line in enumerate(settings, 1) if i > start and line.startswith("def "))
    outside = [p for p in places if not (p.startswith("train/ppo/settings.py:") and start < int(p.rsplit(":", 1)[1]) < end)]
    assert places and not outside, f"derived outside settings.plan_run: {outside}"
