"""``marlhf ppo --advantage tree``: the values and advantages against a brute-force tree
(exact), the D = 1 reduction (the group mean baseline: (K - 1)/K x RLOO), the sampler (leaves
share their ancestors' tokens, nothing drawn is lost, draws independent of the batch, compiled
= eager), every termination rule, and the stage end to end (LoRA, metrics)."""

from __future__ import annotations

import copy
import math
import random

import pytest
import torch

from marlhf_cli import config as config_module
from marlhf_cli.macro import rloo_advantages, sequence_to_tokens
from marlhf_cli.macro.tree import leaves_per_tree, subtree_means, tree_advantages, tree_segment_ids

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# ---------------------------------------------------------------------------------------
# the arithmetic against a tree built node by node


def _brute_force(returns: list[int], starts: list[list[int]], lengths: list[int], branches: int, depth: int):
    """Per-leaf per-token advantages by building each tree: V(node) = the mean of its children's
    values, by recursion (Fractions: exact), V(leaf) = its return; a token belongs to the
    deepest node whose macro action has begun at it."""
    from fractions import Fraction

    def value(tree: list[int], level: int, node: int) -> Fraction:  # node numbered within its level
        if level == depth:
            return Fraction(tree[node])
        return sum((value(tree, level + 1, node * branches + c) for c in range(branches)), Fraction(0)) / branches

    leaves, out = branches**depth, []
    for row, (bounds, length) in enumerate(zip(starts, lengths)):
        tree, own = divmod(row, leaves)
        tree_returns = returns[tree * leaves : (tree + 1) * leaves]
        advantages = []
        for t in range(length):
            level = 1 + sum(1 for b in bounds if b <= t)
            node = own // branches ** (depth - level)
            advantages.append(value(tree_returns, level, node) - value(tree_returns, level - 1, node // branches))
        out.append(advantages)
    return out


@pytest.mark.parametrize("branches,depth", [(2, 1), (3, 1), (2, 2), (2, 3), (3, 2), (4, 2)])
def test_values_and_advantages_equal_a_tree_built_node_by_node(branches, depth):
    rng = random.Random(branches * 10 + depth)
    leaves = branches**depth
    for trial in range(20):
        trees = rng.randint(1, 3)
        rows = trees * leaves
        # integer multiples of K^D: every mean over a block of leaves is exact in floating point
        returns = [rng.randint(-20, 20) * leaves for _ in range(rows)]
        lengths = [rng.randint(0, 12) for _ in range(rows)]
        starts = []
        for length in lengths:  # non-decreasing, some past the end (a path that ended early)
            cuts = sorted(rng.randint(1, length + 2) for _ in range(depth - 1))
            starts.append([min(c, length) for c in cuts])
        width = max(lengths + [1])
        mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
        segment_ids = tree_segment_ids(torch.tensor(starts, dtype=torch.long).reshape(rows, depth - 1), mask)
        got = tree_advantages(torch.tensor(returns, dtype=torch.float64), branches, depth, segment_ids, mask)
        want = _brute_force(returns, starts, lengths, branches, depth)
        for row, n in enumerate(lengths):
            assert got[row, :n].tolist() == [float(a) for a in want[row]], (trial, row)
            assert not got[row, n:].any()
            levels = [0] + starts[row]
            if all(a < b for a, b in zip(levels, levels[1:] + [n])):  # every level has a token:
                total = sum(float(got[row, t]) for t in levels)  # the advantages telescope to R - V(root)
                tree = row // leaves
                assert total == returns[row] - sum(returns[tree * leaves : (tree + 1) * leaves]) / leaves


def test_depth_one_is_the_group_mean_baseline_k_minus_one_over_k_times_rloo():
    torch.manual_seed(0)
    for branches in (2, 3, 4, 8):
        returns = torch.randn(5 * branches, dtype=torch.float64)
        mask = (torch.arange(7)[None, :] < torch.randint(1, 8, (5 * branches, 1))).long()
        ids = tree_segment_ids(torch.zeros((5 * branches, 0), dtype=torch.long), mask)
        got = tree_advantages(returns, branches, 1, ids, mask)
        groups = returns.reshape(-1, branches)
        centred = (groups - groups.mean(dim=1, keepdim=True)).reshape(-1)
        assert torch.equal(got, sequence_to_tokens(centred, mask))
        rloo = sequence_to_tokens(rloo_advantages(returns, branches) * (branches - 1) / branches, mask)
        assert torch.allclose(got, rloo, rtol=0, atol=1e-12)


def test_subtree_means_columns_and_bad_shapes():
    returns = torch.arange(8, dtype=torch.float64)
    means = subtree_means(returns, 2, 3)
    assert means[:, 0].tolist() == [3.5] * 8
    assert means[:, 1].tolist() == [1.5] * 4 + [5.5] * 4
    assert means[:, 2].tolist() == [0.5, 0.5, 2.5, 2.5, 4.5, 4.5, 6.5, 6.5]
    assert means[:, 3].tolist() == returns.tolist()
    assert leaves_per_tree(3, 2) == 9
    with pytest.raises(ValueError, match="at least 2 branches"):
        leaves_per_tree(1, 2)
    with pytest.raises(ValueError, match="depth of at least 1"):
        leaves_per_tree(2, 0)
    with pytest.raises(ValueError, match="do not split into trees of 4 leaves"):
        subtree_means(torch.zeros(6), 2, 2)
    mask = torch.ones(4, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="segments 0 .. 1 only"):
        tree_advantages(torch.zeros(4), 2, 2, torch.full((4, 3), 2), mask)


def test_training_each_leaf_estimates_the_policy_gradient_without_bias():
    """A two-step tabular policy (a1 from softmax(theta1), then a2 from softmax(theta2[a1]),
    reward R[a1, a2]) sampled as trees of K = 3, D = 2. Averaged over the K^D leaves, each
    leaf trained on with its path's advantages, the estimate's mean is (K - 1)/K times the
    exact gradient of J = E[R], within 4 standard errors on every parameter. Training each
    first action once (with its node's advantage) instead shrinks that level's term by K: the
    same test tells it apart."""
    generator = torch.Generator().manual_seed(0)
    branches, depth, trees = 3, 2, 60000
    theta1 = torch.tensor([0.3, -0.4], dtype=torch.float64, requires_grad=True)
    theta2 = torch.tensor([[0.5, -0.2], [-0.7, 0.1]], dtype=torch.float64, requires_grad=True)
    reward = torch.tensor([[1.0, -0.5], [0.2, 2.0]], dtype=torch.float64)
    pi1, pi2 = theta1.softmax(0), theta2.softmax(1)
    (pi1[:, None] * pi2 * reward).sum().backward()
    exact = torch.cat([theta1.grad, theta2.grad.reshape(-1)]) * (branches - 1) / branches
    with torch.no_grad():
        a1 = torch.multinomial(pi1.expand(trees * branches, 2), 1, generator=generator).reshape(trees, branches)
        a2 = torch.multinomial(pi2[a1.reshape(-1)].repeat_interleave(branches, 0), 1, generator=generator)
        a2 = a2.reshape(trees, branches, branches)
        a1_leaf = a1[:, :, None].expand(-1, -1, branches)  # each leaf's first action
        returns = reward[a1_leaf, a2].reshape(-1)
        ids = torch.tensor([[0, 1]]).expand(returns.shape[0], 2)
        advantages = tree_advantages(returns, branches, depth, ids, torch.ones_like(ids)).reshape(trees, -1, 2)
        first, second = a1_leaf.reshape(trees, -1), a2.reshape(trees, -1)
        score1 = torch.nn.functional.one_hot(first, 2).double() - pi1  # grad of log pi1(a1)
        score2 = torch.nn.functional.one_hot(second, 2).double() - pi2[first]  # grad of log pi2(a2 | a1), row a1
        leaves = branches**depth
        g1 = (advantages[..., :1] * score1).sum(1) / leaves
        g2 = torch.zeros(trees, 2, 2, dtype=torch.float64)
        g2.scatter_add_(1, first[..., None].expand(-1, -1, 2), advantages[..., 1:] * score2)
        per_tree = torch.cat([g1, g2.reshape(trees, 4) / leaves], dim=1)
        mean, error = per_tree.mean(0), per_tree.std(0) / trees**0.5
        assert bool(((mean - exact).abs() < 4 * error).all()), (mean, exact, error)
        once = mean.clone()
        once[:2] /= branches  # a first action trained once, not once per leaf below it
        assert bool(((once[:2] - exact[:2]).abs() > 4 * error[:2]).all())


# ---------------------------------------------------------------------------------------
# sampling a tree with the tiny model


from test_critic_free import models  # noqa: E402,F401  (the tiny tokenizer, actor and reference)


def _settings(**overrides):
    from marlhf_cli.train.ppo.experience import RolloutSettings

    return RolloutSettings(**{**dict(max_new_tokens=12, max_prompt_length=32, top_k=0, temperature=0.9), **overrides})


def _segmenter(models, rule, settings, trees=(0, 1)):
    from marlhf_cli.train.ppo.tree import rule_segmenter

    return rule_segmenter(rule, models["tokenizer"], reference=models["reference"], settings=settings, tree_seeds=list(trees), device="cpu")


def _sample(models, rule, *, branches=2, depth=2, settings=None, model=None, prompts=None, seed=0):
    from marlhf_cli.train.ppo.tree import sample_tree, tree_seed

    settings = settings or _settings()
    leaves = branches**depth
    prompts = prompts or ["first prompt"] * leaves + ["the second prompt is longer than that"] * leaves
    return sample_tree(
        model or models["actor"], models["tokenizer"], prompts, settings, branches=branches, depth=depth,
        segmenter=_segmenter(models, rule, settings, range(len(prompts) // leaves)),
        seeds=lambda tree, level, node, child: tree_seed(seed, 0, tree, level, node, child),
    )  # fmt: skip


def _paths(drawn):
    return [row[: int(n)].tolist() for row, n in zip(drawn.response_ids, drawn.mask.sum(1))]


def test_leaves_share_their_ancestors_and_nothing_drawn_is_lost(models):
    from marlhf_cli.macro import TerminationRule

    for branches, depth in ((2, 2), (3, 2), (2, 3)):
        drawn = _sample(models, TerminationRule("fixed", n=3), branches=branches, depth=depth)
        leaves, paths = branches**depth, _paths(drawn)
        assert len(paths) == 2 * leaves and drawn.branch_positions.shape == (2 * leaves, depth - 1)
        unique_tokens = 0
        for row, path in enumerate(paths):
            starts = drawn.branch_positions[row].tolist()
            # fixed n=3: level d + 1 begins at 3d, or at the end of a path that ended before it
            assert starts == [min(3 * (d + 1), len(path)) for d in range(depth - 1)]
            for level in range(1, depth):
                block = branches ** (depth - level)  # leaves below the row's level-d node
                sibling_rows = range(row // block * block, row // block * block + block)
                for other in sibling_rows:  # they share the prefix up to the node's end
                    assert paths[other][: starts[level - 1]] == path[: starts[level - 1]]
        # the tokens drawn: each node's K (root) or K - 1 new completions, each counted once
        for tree in range(2):
            rows = paths[tree * leaves : (tree + 1) * leaves]
            unique_tokens += _drawn_tokens(rows, drawn.branch_positions[tree * leaves : (tree + 1) * leaves].tolist(), branches, depth)
        assert drawn.sampled_tokens == unique_tokens
        assert drawn.shared_tokens == int(drawn.mask.sum()) - unique_tokens >= 0


def _drawn_tokens(paths, starts, branches, depth):
    """Tokens drawn for one tree, counted from its leaves: a leaf that is child c > 0 of its
    level-d node (its deepest such) drew from that node's start on; child 0 at every level
    (the first leaf of each level-1 node) drew from 0; copies of an ended path drew nothing."""
    total = 0
    for leaf, path in enumerate(paths):
        digits = [(leaf // branches ** (depth - 1 - d)) % branches for d in range(depth)]  # child index per level
        deepest = max((d for d in range(1, depth) if digits[d] > 0), default=0)
        begin = 0 if deepest == 0 else starts[leaf][deepest - 1]
        parent_path = paths[leaf - digits[deepest] * branches ** (depth - 1 - deepest)]
        if deepest and begin >= len(parent_path):  # its node had ended: a copy
            continue
        total += len(path) - begin
    return total


def test_a_completion_draws_what_it_draws_alone_and_compiled_draws_what_eager_draws(models):
    from marlhf_cli.macro import TerminationRule

    rule = TerminationRule("fixed", n=4)
    together = _sample(models, rule)
    alone = _sample(models, rule, prompts=["first prompt"] * 4)  # tree 0 by itself: the same seeds
    assert _paths(alone) == _paths(together)[:4]
    compiled = _sample(models, rule, settings=_settings(generation="compiled"))
    assert _paths(compiled) == _paths(together)
    assert torch.equal(compiled.branch_positions, together.branch_positions)
    other_seed = _sample(models, rule, seed=1)
    assert _paths(other_seed) != _paths(together)


def test_children_start_from_their_parents_cache_rows_and_draw_what_a_fresh_read_draws(models, monkeypatch, capsys):
    """Depth 3, so that level 2's calls start from rows of level 0's and level 1's calls at
    once: the tree is the one drawn when every call reads its prefixes again, and the prefixes
    it did not read again are every branching node's prompt and path but the fed last token."""
    from marlhf_cli.macro import TerminationRule
    from marlhf_cli.train.ppo import tree

    rule = TerminationRule("fixed", n=3)
    for generation in ("eager", "compiled"):
        cached = _sample(models, rule, depth=3, settings=_settings(generation=generation))
        with monkeypatch.context() as patched:
            patched.setattr(tree, "_start_cache", lambda *args: None)
            read_again = _sample(models, rule, depth=3, settings=_settings(generation=generation))
        assert _paths(cached) == _paths(read_again)
        assert torch.equal(cached.branch_positions, read_again.branch_positions)
        assert read_again.cached_prefix_tokens == 0
        # every node that branched (levels 1 and 2) sent its prompt and path but the last token
        expected, leaves = 0, 8
        prompt_lengths = [int(m.sum()) for m in cached.prompt_mask[::leaves]]
        paths = _paths(cached)
        for level, block in ((1, 4), (2, 2)):  # leaves below one node of the level
            for first in range(0, len(paths), block):
                end = int(cached.branch_positions[first, level - 1])
                if end < len(paths[first]):  # it branched: its path went on past its end
                    expected += prompt_lengths[first // leaves] + end - 1
        assert cached.cached_prefix_tokens == expected > 0
    # a model whose cache does not travel (a sliding-window layer): the prefixes are read
    # again, the same tree, and the run is told once
    from marlhf_cli.generation import eager

    tree._say_once.cache_clear()
    with monkeypatch.context() as patched:
        patched.setattr(eager, "from_dynamic", lambda cache: None)
        untravelled = _sample(models, rule, depth=3)
    assert _paths(untravelled) == _paths(cached) and untravelled.cached_prefix_tokens == 0
    assert "each level reads its nodes' prompt and path again" in capsys.readouterr().err


@pytest.mark.parametrize("rule_name", ["fixed", "randomized", "ppl", "parsing", "code"])
def test_every_rule_branches_where_it_ends_a_macro_action(models, rule_name):
    from marlhf_cli.macro import TerminationRule
    from marlhf_cli.macro.segmentation import missing_parser

    rule = TerminationRule(rule_name, n=3, cutoff=3 if rule_name in ("parsing", "code") else None, seed=5)
    if missing_parser(rule):
        pytest.skip(missing_parser(rule))
    settings = _settings(max_new_tokens=16)
    drawn = _sample(models, rule, settings=settings)
    segmenter = _segmenter(models, rule, settings)
    leaves = 4
    rows = torch.arange(len(drawn.mask))
    ids, fallbacks = segmenter(drawn.prompt_ids, drawn.prompt_mask, drawn.response_ids, drawn.mask, (rows // leaves).tolist())
    assert fallbacks >= 0
    for row in range(0, len(rows), 2):  # child 0 of each level-1 node: its text is the path the rule cut
        n, start = int(drawn.mask[row].sum()), int(drawn.branch_positions[row, 0])
        assert 1 <= start <= n
        if start < n:  # the first position after 0 where the rule begins a segment
            begins = [t for t in range(1, n) if ids[row, t] != ids[row, t - 1]]
            assert begins and begins[0] == start
        else:  # the rule put no boundary in the path: its node is the whole path
            assert bool((ids[row, :n] == ids[row, 0]).all())
    if rule_name == "randomized":  # one seed per tree: every path of a tree is cut alike
        lengths = [[int((ids[r] == s).logical_and(drawn.mask[r].bool()).sum()) for s in range(int(ids[r].max()) + 1)] for r in rows]
        for tree in range(2):
            firsts = {lengths[r][0] for r in range(tree * leaves, (tree + 1) * leaves) if drawn.mask[r].sum() > lengths[r][0]}
            assert len(firsts) <= 1


def _tree_experience(models, tmp_path, depth: int):
    """A rollout of 2 prompts' trees (K = 2, fixed n = 4) through make_experience with the
    tree's draw, credited by the registry's tree entry."""
    from types import SimpleNamespace

    from marlhf_cli.macro import TerminationRule
    from marlhf_cli.train.ppo.estimators import ESTIMATORS, CreditInputs
    from marlhf_cli.train.ppo.experience import make_experience
    from marlhf_cli.train.ppo.settings import plan_run

    config = config_module.resolve("ppo", flags=dict(
        policy="tiny", reward_model="tiny", dataset="tldr", rollout_batch_size=2, mini_batch_size=2, max_new_tokens=12,
        max_prompt_length=32, advantage="tree", termination="fixed", n=4, tree_branches=2, tree_depth=depth, run_dir=str(tmp_path),
    ))  # fmt: skip
    plan = plan_run(config)
    leaves = 2**depth
    assert plan.group_size == leaves and not plan.critic
    settings = _settings(kl_coef=0.1)
    prompts = ["first prompt"] * leaves + ["the second prompt is longer than that"] * leaves

    def reward(batch):
        ids, mask = batch.response_ids.cpu(), batch.response_mask.cpu().bool()
        return ((ids % 2 == 0) & mask).sum(1).float() / mask.sum(1).clamp(min=1).float()

    reward.name = "even"
    rule = TerminationRule("fixed", n=4)
    draw = lambda model, p: _sample(models, rule, depth=depth, settings=settings, model=model, prompts=p)  # noqa: E731
    reference = copy.deepcopy(models["reference"])
    with torch.no_grad():  # a reference that differs, so the returns carry a KL
        for parameter in reference.parameters():
            parameter.add_(0.02 * torch.randn(parameter.shape, generator=torch.Generator().manual_seed(1)))
    exp = make_experience(models["actor"], reference, None, reward, models["tokenizer"], prompts,
                          [{}] * len(prompts), settings, draw=draw)  # fmt: skip
    ctx = SimpleNamespace(config=config, plan=plan, models=None, rule=plan.rule, rollout=settings, executor=None)
    ESTIMATORS["tree"].assign(exp, CreditInputs(ctx, 0, list(range(len(prompts))), models["actor"], None))
    return exp


def test_the_estimator_on_a_sampled_tree_matches_the_definition(models, tmp_path):
    """Leaf returns are the KL-shaped sequence rewards; advantages V(node) - V(parent) per segment."""
    exp = _tree_experience(models, tmp_path, depth=2)
    returns = (exp.rewards * exp.mask).sum(1).double()
    assert exp.returns is None and exp.segment_stats.segments == int((exp.segment_ids.amax(1) + 1).sum())
    assert exp.kl.abs().sum() > 0  # the KL is in the returns: kl_coef 0.1
    for row in range(8):
        tree, node = row // 4, row // 2
        root, own = returns[tree * 4 : tree * 4 + 4].mean(), returns[node * 2 : node * 2 + 2].mean()
        n, start = int(exp.mask[row].sum()), int(exp.tree.branch_positions[row, 0])
        assert torch.allclose(exp.advantages[row, :start].double(), (own - root).expand(start).float().double(), atol=1e-6)
        assert torch.allclose(exp.advantages[row, start:n].double(), (returns[row] - own).expand(n - start).float().double(), atol=1e-6)
    assert exp.tree.shared_tokens > 0  # the leaves' shared first macro actions were drawn once


def test_depth_one_on_a_rollout_is_k_minus_one_over_k_times_rloo(models, tmp_path):
    from marlhf_cli.train.ppo import credit

    exp = _tree_experience(models, tmp_path, depth=1)
    assert exp.tree.shared_tokens == 0 and exp.tree.branch_positions.shape == (4, 0)
    assert bool((exp.segment_ids == 0).all())
    tree = exp.advantages.clone()
    credit.assign_group_credit(exp, "rloo", 2)
    assert torch.allclose(tree, exp.advantages / 2, atol=1e-6) and tree.abs().sum() > 0


def test_options_names_and_errors(tmp_path):
    from marlhf_cli.errors import UserError
    from marlhf_cli.train.ppo import settings

    def plan(_given=(), **flags):
        base = dict(policy="tiny", reward_model="tiny", rollout_batch_size=2, mini_batch_size=2, run_dir=str(tmp_path), advantage="tree")
        return settings.plan_run(config_module.resolve("ppo", flags={**base, **flags}), given_flags=_given)

    assert plan(termination="fixed", n=8).name == "tree-fixed8"
    deep = plan(termination="ppl", tree_branches=3, tree_depth=3)
    assert deep.name == "tree-ppl-b3-d3" and deep.group_size == 27 and deep.responses_per_step == 54
    assert "27 leaves per prompt" in deep.describe(deep_config := config_module.resolve("ppo", flags=dict(
        advantage="tree", termination="ppl", tree_branches=3, tree_depth=3)))  # fmt: skip
    assert "the ends of the first 2 macro actions" in deep.describe(deep_config)
    with pytest.raises(UserError, match="--samples-per-prompt does not apply"):
        plan(termination="fixed", n=8, _given=["--samples-per-prompt"])
    with pytest.raises(UserError, match=r"--tree-depth does not apply \(drop it, or use --advantage tree\)"):
        plan(advantage="mc", samples_per_prompt=2, _given=["--tree-depth"])
    for flags, message in ((dict(tree_branches=1), "--tree-branches"), (dict(tree_depth=0), "--tree-depth")):
        with pytest.raises(UserError, match=message):
            config_module.resolve("ppo", flags={"advantage": "tree", **flags})


@pytest.mark.parametrize("branches,depth,termination,ratio", [
    (2, 2, "fixed", "token"), (3, 2, "ppl", "token"), (2, 3, "randomized", "macro"), (4, 1, "fixed", "token"),
])  # fmt: skip
def test_the_hint_for_a_tree_name_makes_a_run_of_that_name(branches, depth, termination, ratio):
    """--compare with a missing tree run names the flags that make it: the name round-trips."""
    import shlex

    from marlhf_cli.train import ppo
    from marlhf_cli.train.ppo import report

    flags = dict(advantage="tree", termination=termination, tree_branches=branches, tree_depth=depth, ratio=ratio)
    if termination == "fixed":
        flags["n"] = 4
    name = ppo.run_name(config_module.resolve("ppo", flags=flags))
    words = shlex.split(report.options_for(name))
    again = {flag[2:].replace("-", "_"): value for flag, value in zip(words[::2], words[1::2])}
    assert again["advantage"] == "tree" and ppo.run_name(config_module.resolve("ppo", flags=again)) == name
    assert report.options_for("tree-rloo") is None and report.options_for("tree-fixed4-k8") is None


# ---------------------------------------------------------------------------------------
# the stage end to end


@pytest.mark.slow
@pytest.mark.parametrize("lora", [False, True])
def test_the_stage_trains_on_every_leaf_and_counts_tokens_drawn_once(tmp_path, lora):
    from typer.testing import CliRunner

    from marlhf_cli.artifacts import read_jsonl
    from marlhf_cli.cli import app

    args = ["ppo", "--preset", "cpu-tiny", "--advantage", "tree", "--termination", "fixed", "--n", "4",
            "--run-dir", str(tmp_path), "--policy", "tiny", "--reward-model", "tiny", "--max-steps", "2",
            "--eval-every", "2", "--eval-prompts", "2", "--max-new-tokens", "12", "--rollout-batch-size", "2"]  # fmt: skip
    if lora:
        args += ["--lora-rank", "4"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "tree rollouts" in " ".join(result.output.split())
    out = tmp_path / "ppo" / "tree-fixed4"
    assert (out / "config.json").is_file() and not (out / "critic").exists()
    train = [r for r in read_jsonl(tmp_path / "metrics" / "ppo-tree-fixed4.jsonl") if r["split"] == "train"]
    assert len(train) == 2
    for row in train:
        assert row["responses"] == 8 and row["continuations"] == 0
        assert row["generated_tokens"] == row["response_tokens"] - row["shared_prefix_tokens"]
        # 2 trees, each: 2 completions from the prompt, then 1 more from each level-1 node's end at 4
        assert row["generated_tokens"] <= 2 * (2 * 12 + 2 * 8)
        assert row["shared_prefix_tokens"] > 0 and "value_loss" not in row and math.isfinite(row["policy_loss"])
        assert row["segments_per_response"] <= 2
