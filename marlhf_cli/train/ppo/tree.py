"""Tree rollouts for ``--advantage tree`` (docs/method.md "Tree rollouts over macro actions").

One prompt's tree has branching factor K (``--tree-branches``) and depth D (``--tree-depth``);
it is sampled as K^D whole responses, its leaves, and nothing sampled is thrown away:

1. K completions of the prompt are drawn, each to EOS or ``--max-new-tokens``. Each is a path;
   its current node starts at response position 0.
2. At each level d = 1 .. D - 1, every path's node ends at the first boundary the termination
   rule puts after the node's start in that path's text (the rule cuts the whole response as
   it would any response). The node gets K children: the path itself goes on as child 0
   (its next macro action is the rest of its own completion), and K - 1 new completions are
   drawn from prompt + response[:boundary]. A path with no boundary left (it ended within
   this node) cannot branch: its K children are copies of it with empty macro actions, so the
   subtree's value is its return and its tokens keep the weight of a node of their level.
3. After level D - 1 the K^D paths are the leaves, in the order of their base-K digits.

Nothing is read twice: a completion's call keeps its KV cache (:mod:`marlhf_cli.generation.cache_rows`),
and a node's K - 1 new children start from the rows of the call that drew its path, cut at the
node's end and realigned to one left padding; only the node's last token is fed again (its
logits draw the first token). The K - 1 children share that row (the sampler copies it:
``repeats``). Where the model's cache does not travel (a sliding-window or recurrent layer),
each level reads its node prefixes again, which gives the same draws to float rounding.

Randomness: completion (tree, level, node, child) draws its tokens from its own generator,
seeded with derived_seed(seed, step, the tree's first sample number, level, node, child), as
mc's continuations are: its draws depend neither on the rest of the batch nor on the process,
and a resumed run samples the same tree.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Callable, Sequence

import torch

from ... import console
from ...generation import sample, texts
from ...generation.cache_rows import CacheRows, Slice, realigned
from ...seeding import derived_seed
from ...macro import TerminationRule
from ..forward import policy_forward, resident
from .continuations import budgeted_mask, left_padded, row_uniforms
from .credit import segment_responses
from .experience import RolloutSettings, batched_forward

# (prompt ids, prompt mask, response ids, response mask, the tree of each row) of whole paths
# in; (their segment ids [N, T], the texts the rule could not parse) out: the termination
# rule, given the reference log-probs or the text it reads (rule_segmenter)
Segmenter = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, Sequence[int]], tuple[torch.Tensor, int]]


@dataclass
class _Drawn:
    """Where a path's latest completion's keys and values are: row ``row`` of ``cache``, response
    position j at column ``offset + j`` (the call's prompt width minus where the completion began)."""

    cache: CacheRows
    row: int
    offset: int


@dataclass
class _Path:
    tokens: list[int]  # the response so far: the path's prefix, then its latest completion
    eos: bool  # its completion ended with a stop token
    starts: list[int]  # where each level's node after the first begins (response positions)
    drawn: _Drawn | None = None  # None: its cache did not travel, or is not needed any more

    @property
    def start(self) -> int:
        return self.starts[-1] if self.starts else 0


@dataclass
class TreeRollout:
    """The leaves of a batch of trees, as a rollout's responses."""

    prompt_ids: torch.Tensor  # [N, P] left-padded, N = trees x K^D
    prompt_mask: torch.Tensor
    response_ids: torch.Tensor  # [N, T] pad after the end
    mask: torch.Tensor  # [N, T] long, real up to and including the stop token
    has_eos: torch.Tensor  # [N] bool
    branch_positions: torch.Tensor  # [N, D - 1] where the level 2 .. D nodes begin
    sampled_tokens: int  # real tokens drawn (each completion up to its stop token)
    completions: int  # sampler rows drawn: K per tree, then K - 1 per node that branched
    fallbacks: int  # paths a text rule could not parse at a branching (cut by fixed n instead)
    cached_prefix_tokens: int  # prefix tokens (prompt and path) the children's calls did not read again

    @property
    def shared_tokens(self) -> int:
        """Real tokens of the leaves that were not drawn for them: the prefixes they share."""
        return int(self.mask.sum()) - self.sampled_tokens


def tree_seed(seed: int, step: int, tree_number: int, level: int, node: int, child: int) -> int:
    """The seed of one completion: of the run, the step, the tree (its first response's global
    sample number), the level it is drawn at (0: from the prompt), the node within its level
    and the child (0 .. K - 1)."""
    return derived_seed(seed, step, tree_number, level, node, child, "tree")


@torch.no_grad()
def sample_tree(
    model,
    tokenizer,
    prompts: Sequence[str],
    settings: RolloutSettings,
    *,
    branches: int,
    depth: int,
    segmenter: Segmenter,
    seeds: Callable[[int, int, int, int], int],
    device="cpu",
) -> TreeRollout:
    """Sample the trees of ``prompts`` (K^D consecutive equal prompts per tree).

    ``settings``: the rollout's (temperature, top-k/p, the longest response, stop tokens);
    ``seeds(tree, level, node, child)``: the seed of a completion (tree: its index in this
    batch); ``segmenter``: the termination rule on whole paths (see :data:`Segmenter`)."""
    leaves = branches**depth
    if len(prompts) % leaves:
        raise ValueError(f"{len(prompts)} prompts do not split into trees of {leaves} leaves")
    stop, pad = (tokenizer.eos_token_id, *settings.stop_token_ids), tokenizer.pad_token_id
    longest = settings.max_new_tokens
    prompt_ids, prompt_mask = texts.tokenize_prompts(tokenizer, prompts[::leaves], settings.max_prompt_length, device)
    prompt_rows = [ids[m.bool()] for ids, m in zip(prompt_ids, prompt_mask)]
    trees = len(prompt_rows)
    counts = {"tokens": 0, "rows": 0, "fallbacks": 0, "reused": 0}

    def draw(prefixes: list[tuple[int, list[int], _Drawn | None]], level: int, nodes: list[int], children: int, keep: bool):
        """``children`` completions of each (tree, response prefix, where its keys and values
        are), seeded by (tree, level, node, child 1 .. children when drawn from a branch point,
        0 .. children - 1 at the root); a list per prefix of (tokens, ended, where they are)."""
        if not prefixes:
            return []
        first = 0 if level == 0 else 1
        rows = [torch.cat([prompt_rows[t], torch.tensor(p, dtype=torch.long, device=device)]) for t, p, _ in prefixes]
        ids, mask = left_padded(rows, pad, device)
        start = _start_cache(prefixes, [len(r) for r in rows], ids.shape[1])
        budgets = torch.tensor([longest - len(p) for _, p, _ in prefixes], device=device).repeat_interleave(children)
        row_seeds = [seeds(t, level, node, first + c) for (t, _, _), node in zip(prefixes, nodes) for c in range(children)]
        width = int(budgets.max())
        drawn = sample(
            model, ids, mask, settings.sampling_for(width), eos_token_id=stop, pad_token_id=pad,
            uniforms=row_uniforms(row_seeds, budgets.tolist(), width).to(device), budgets=budgets, repeats=children,
            start=start, keep_cache=keep,
        )  # fmt: skip
        drawn, cache = drawn if keep else (drawn, None)
        if keep and cache is None:
            _say_once("tree: this model's KV cache is not one that travels between sampler calls (a sliding-window or "
                      "recurrent layer): each level reads its nodes' prompt and path again")  # fmt: skip
        real, ended = budgeted_mask(drawn, budgets, stop)
        counts["tokens"] += int(real.sum())
        counts["rows"] += len(row_seeds)
        counts["reused"] += 0 if start is None else int(mask.sum()) - len(prefixes)
        out = []
        for index, (_, prefix, _) in enumerate(prefixes):
            offset = ids.shape[1] - len(prefix)  # response position 0's column in this call
            rows_of = range(index * children, (index + 1) * children)
            where = [None if cache is None else _Drawn(cache, r, offset) for r in rows_of]
            out.append([(drawn[r, : int(real[r].sum())].tolist(), bool(ended[r]), w) for r, w in zip(rows_of, where)])
        return out

    # level 0: K completions of each prompt
    roots = draw([(t, [], None) for t in range(trees)], 0, [0] * trees, branches, keep=depth > 1)
    paths = [_Path(tokens, eos, [], where) for tree in roots for tokens, eos, where in tree]
    for level in range(1, depth):
        per_tree = branches**level  # nodes of this level in one tree, in order
        ends, fallbacks = _node_ends(paths, segmenter, prompt_ids, prompt_mask, per_tree=per_tree, pad=pad, device=device)
        counts["fallbacks"] += fallbacks
        branching = [i for i, (path, end) in enumerate(zip(paths, ends)) if end < len(path.tokens)]
        fresh = draw(
            [(i // per_tree, paths[i].tokens[: ends[i]], paths[i].drawn) for i in branching], level,
            [i % per_tree for i in branching], branches - 1, keep=level < depth - 1,
        )  # fmt: skip
        new_children = dict(zip(branching, fresh))
        last = level == depth - 1  # the leaves: no cache is needed below them
        grown: list[_Path] = []
        for index, (path, end) in enumerate(zip(paths, ends)):
            starts = path.starts + [end]
            grown.append(_Path(path.tokens, path.eos, starts, None if last else path.drawn))  # child 0: the path goes on
            if index in new_children:
                grown += [_Path(path.tokens[:end] + tokens, eos, starts, where) for tokens, eos, where in new_children[index]]
            else:  # ended within its node: copies with empty macro actions below it
                grown += [_Path(path.tokens, path.eos, starts) for _ in range(branches - 1)]
        paths = grown
    return _as_rollout(paths, prompt_ids, prompt_mask, leaves, depth, pad, counts, device)


@functools.cache
def _say_once(message: str) -> None:
    console.say(message)


def _start_cache(prefixes, lengths: list[int], width: int) -> CacheRows | None:
    """The keys and values of each prefix but its last token, cut from the call that drew its
    path and right-aligned to ``width - 1`` columns (the sampler's left padding), or None when
    one of them is not at hand (level 0; a cache that did not travel): the call reads them."""
    where = [drawn for _, _, drawn in prefixes]
    if any(w is None for w in where):
        return None
    slices = []
    for (_, prefix, drawn), length in zip(prefixes, lengths):
        # up to the column of the prefix's last token, which is fed again; the prompt's first
        # token is length - 1 columns before it in the source's layout as in the new one
        end = drawn.offset + len(prefix) - 1
        slices.append(Slice(drawn.cache, drawn.row, end, length - 1))
    return realigned(slices, width - 1)


def _node_ends(paths: list[_Path], segmenter: Segmenter, prompt_ids, prompt_mask, *, per_tree: int, pad: int, device) -> tuple[list[int], int]:
    """Each path's current node's end (the first position after its start where the rule
    begins a segment, or the path's length when there is none), and the rule's fallbacks."""
    response_ids, mask = _right_padded([p.tokens for p in paths], pad, device)
    owners = torch.arange(len(paths), device=device) // per_tree
    segment_ids, fallbacks = segmenter(prompt_ids[owners], prompt_mask[owners], response_ids, mask, owners.tolist())
    begins = torch.zeros_like(mask, dtype=torch.bool)
    begins[:, 1:] = mask[:, 1:].bool() & (segment_ids[:, 1:].to(mask.device) != segment_ids[:, :-1].to(mask.device))
    ends = []
    for row, path in enumerate(paths):
        later = begins[row, path.start + 1 :].nonzero()
        ends.append(path.start + 1 + int(later[0]) if len(later) else len(path.tokens))
    return ends, fallbacks


def _right_padded(rows: Sequence[list[int]], pad: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), pad, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = torch.tensor(row, dtype=torch.long, device=device)
        mask[index, : len(row)] = 1
    return ids, mask


def _as_rollout(paths: list[_Path], prompt_ids, prompt_mask, leaves: int, depth: int, pad: int, counts, device) -> TreeRollout:
    response_ids, mask = _right_padded([p.tokens for p in paths], pad, device)
    owners = torch.arange(len(paths), device=device) // leaves
    branch_positions = torch.tensor([p.starts for p in paths], dtype=torch.long, device=device).reshape(len(paths), depth - 1)
    return TreeRollout(
        prompt_ids=prompt_ids[owners], prompt_mask=prompt_mask[owners], response_ids=response_ids, mask=mask,
        has_eos=torch.tensor([p.eos for p in paths], device=device), branch_positions=branch_positions,
        sampled_tokens=counts["tokens"], completions=counts["rows"], fallbacks=counts["fallbacks"],
        cached_prefix_tokens=counts["reused"],
    )  # fmt: skip


def rule_segmenter(rule: TerminationRule, tokenizer, *, reference, settings: RolloutSettings, tree_seeds: Sequence[int],
                   device, executor=None) -> Segmenter:  # fmt: skip
    """The termination rule on whole paths, as credit assignment cuts responses: ``ppl`` reads
    the reference's log-probs of the path (one forward per branching level), ``parsing`` and
    ``code`` its text with the span of every generated id, ``randomized`` one seed per tree
    (``tree_seeds[tree]``), so that the paths of a tree are cut alike."""

    def segment(prompt_ids, prompt_mask, response_ids, mask, trees):
        refs = None
        if rule.name == "ppl":  # the one rule that reads the reference: its log-probs of the paths
            sequences = torch.cat([prompt_ids, response_ids], dim=1)
            attention = torch.cat([prompt_mask, mask], dim=1)
            plen = prompt_ids.shape[1]
            with resident(reference, device, settings.offload_frozen):
                refs = batched_forward(
                    lambda s: policy_forward(reference, sequences[s], attention[s], plen, settings.temperature)[0],
                    sequences.shape[0], settings.forward_batch_size,
                )  # fmt: skip
        paths = SimpleNamespace(mask=mask, response_ids=response_ids, ref_logp=refs)  # what credit assignment reads of a rollout
        segment_ids, stats = segment_responses(
            paths, rule, tokenizer=tokenizer, sample_seeds=[tree_seeds[t] for t in trees], executor=executor
        )
        return segment_ids, stats.fallbacks

    return segment
