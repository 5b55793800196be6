"""``marlhf bon``: best-of-N reward-model scores over a temperature sweep (the paper's Figure 8).

For every distinct prompt of the evaluation split and every temperature, the policy samples
M = max(--n) responses, the reward model scores them, and the expected score of the best of
N (for each N in --n) follows from those M scores with the unbiased estimator of
:mod:`.estimator`: one generation per temperature, whatever the number of N.

``--reward py:FILE.py:FUNCTION`` scores with the user's Python function instead of a reward
model (:mod:`..rewards.function`; it sees each prompt's record, as in PPO), so best-of-N
picks the response the function likes best. ``--env py:FILE.py:NAME`` makes each sample an
episode with the user's environment (:mod:`marlhf_cli.episodes`, as ``ppo --env`` plays them),
scored by its return: the best of N episodes per record.

Sampling and scoring reuse the PPO stage's pieces, so scores are comparable with ``marlhf
ppo``'s evaluation: prompts are rendered and encoded as in training (``--chat-template``, :mod:`marlhf_cli.chat`;
:func:`..generation.texts.generate`, left-padded, mask-derived positions, plain ``logits /
T`` sampling, top-k/top-p only when asked, stopping at EOS or the template's end of turn),
and the reward model reads its score at the last real response token
(:class:`marlhf_cli.scoring.rewards.RewardModelReward`). When the reward model's tokenizer differs from
the policy's, responses are re-tokenized as text for it (:func:`.rm_judge.score_texts`).

Resumable: each finished temperature is written to ``bon/<name>/t<T>.json`` (every sample
and score, with a fingerprint of the settings); a rerun with the same settings skips those
temperatures (and loads no model when none is left), a changed setting samples again.
Randomness per temperature comes from (seed, T), so a resumed sweep equals an unbroken one.

Outputs: ``bon/<name>.json`` (every figure), ``bon/<name>-best.jsonl`` (the chosen response
of each prompt and temperature, with its score), ``plots/bon-<name>.png``, a table, and a
``bon/<name>`` entry in ``run.json``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .. import artifacts
from .. import config as config_module
from ..artifacts import RunDir, safe_name
from ..accepts import parse_list
from ..data.records import one_per_prompt
from ..errors import UserError
from ..rewards.function import FunctionReward, file_digest, is_function_spec
from ..seeding import derived_seed
from ..wording import count
from . import estimator, plots, tables

STAGE = "bon"


# ---------------------------------------------------------------------------------------
# options


def check(config) -> tuple[list[int], list[float]]:
    """The N and the temperatures (every value was checked with the options: accepts.ACCEPTS)."""
    return parse_list(config.n, int, "--n"), parse_list(config.temperature, float, "--temperature")


def load_prompts(config, console) -> tuple[list[dict], str, int]:
    """Records of the eval split's distinct prompts, the first --max-records of them; the
    source, and how many distinct prompts the eval split holds."""
    from ..data import load_records

    from ..data.records import PROMPT_KINDS

    from ..data.loader import hub_options

    result = load_records(config.dataset, data_file=config.data_file, split="eval", strict=config.strict, **hub_options(config))
    result.require(STAGE, PROMPT_KINDS)
    if result.notice:
        console.print(result.notice, highlight=False, soft_wrap=True)
    if result.report.total_skipped:
        console.print(f"{result.source}: {result.report.summary()}", highlight=False, soft_wrap=True)
    distinct = one_per_prompt(result.records)
    if not distinct:
        raise UserError(f"{result.source}: the eval split has no prompts")
    return distinct[: config.max_records or None], result.source, len(distinct)


def fingerprint(config, policy: str, reward_model: str, prompts: Sequence[str], samples: int, temperature: float) -> dict:
    """What a cached temperature must share with this run to be reused (``prompts``: as the
    policy reads them, so another --chat-template samples again)."""
    digest = hashlib.sha256("\x00".join(prompts).encode("utf-8")).hexdigest()[:16]
    keys = ("seed", "top_k", "top_p", "max_prompt_length", "max_new_tokens", "normalize")
    if config.env:  # an episode's budgets decide what a sample is
        keys += ("env", "max_turns", "max_episode_tokens")
    return {"policy": policy, "reward_model": reward_model, "prompts": digest, "samples": samples,
            "temperature": temperature, **{k: getattr(config, k) for k in keys}}  # fmt: skip


# ---------------------------------------------------------------------------------------
# sampling and scoring


@dataclass
class Models:
    policy: Any
    tokenizer: Any
    reward: Any  # callable(ScoringBatch) -> [B] scores; None with --env (an episode's return)
    device: Any
    chat: Any  # the policy's ChatFormat: how a record's prompt becomes text (--chat-template)
    episodes: Any = None  # --env: marlhf_cli.episodes.Episodes


class TextReward:
    """Scores for a reward model with its own tokenizer: the records and responses are
    rendered for it (its own chat template under --chat-template auto) and tokenized."""

    def __init__(self, model, tokenizer, *, chat_template: str, normalize: bool, max_prompt: int, max_response: int, batch_size: int):
        from ..chat import ChatFormat
        from ..scoring.heads import reward_stats

        self.model, self.tokenizer = model, tokenizer
        self.chat = ChatFormat(tokenizer, chat_template)
        self.mean, self.std = reward_stats(model.config) if normalize else (0.0, 1.0)
        self.std = self.std if self.std > 1e-6 else 1.0
        self.kwargs = dict(max_prompt=max_prompt, max_response=max_response, batch_size=batch_size)

    def __call__(self, batch):
        import torch

        from .rm_judge import score_rendered

        rendered = [self.chat.render(record, text=text) for record, text in zip(batch.records, batch.responses)]
        scores = score_rendered(self.model, self.tokenizer, rendered, **self.kwargs)
        return (torch.tensor(scores) - self.mean) / self.std


def load_models(config, policy: str, reward_model: str | None) -> Models:
    """The policy, and the reward: the reward model (``reward_model``), or with ``reward_model``
    None the user's function (``--reward py:...``)."""
    import torch

    from ..chat import ChatFormat
    from ..models import load_causal_lm, load_reward_model, load_tokenizer
    from ..train.forward import disable_dropout
    from ..scoring.rewards import RewardModelReward

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = load_tokenizer(policy, padding_side="left")
    model = load_causal_lm(policy)
    disable_dropout(model)
    model.eval().requires_grad_(False).to(device)
    model.config.pad_token_id = tokenizer.pad_token_id
    if config.env:  # the environment scores each episode
        from ..episodes import from_config

        return Models(model, tokenizer, None, device, ChatFormat(tokenizer, config.chat_template), from_config(config))
    if reward_model is None:

        return Models(model, tokenizer, FunctionReward(config.reward), device, ChatFormat(tokenizer, config.chat_template))
    rm = load_reward_model(reward_model)
    disable_dropout(rm)
    rm.eval().requires_grad_(False).to(device)
    rm_tokenizer = load_tokenizer(reward_model)
    if rm_tokenizer.get_vocab() == tokenizer.get_vocab():
        reward = RewardModelReward(rm, normalize=config.normalize, batch_size=config.batch_size)
    else:
        reward = TextReward(rm, rm_tokenizer, chat_template=config.chat_template, normalize=config.normalize,
                            max_prompt=config.max_prompt_length, max_response=config.max_new_tokens + 1,
                            batch_size=config.batch_size)  # fmt: skip
    return Models(model, tokenizer, reward, device, ChatFormat(tokenizer, config.chat_template))


def sample_temperature(models: Models, records: Sequence[dict], temperature: float, samples: int, config, advance) -> list[dict]:
    """``samples`` scored responses per prompt at one temperature: [{"prompt", "samples": [...]}]."""
    import torch

    from ..generation import SamplingParams
    from ..generation.texts import generate
    from ..scoring.rewards import scoring_batch

    sampling = SamplingParams(
        temperature, config.top_k, config.top_p, config.max_new_tokens, generation=config.generation,
        cache_length=config.max_prompt_length + config.max_new_tokens,
    )  # fmt: skip
    rows = [r for r in records for _ in range(samples)]
    out: list[dict] = []
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(derived_seed(config.seed, STAGE, f"{temperature:g}"))
        for start in range(0, len(rows), config.batch_size):
            part = rows[start : start + config.batch_size]
            if models.episodes is not None:
                out.extend(_episodes(models, part, start, sampling, temperature, config))
                advance(len(part), sum(s["score"] for s in out) / len(out))
                continue
            prompts = [models.chat.prompt(r) for r in part]
            prompt_ids, prompt_mask, response_ids, mask, has_eos, _ = generate(
                models.policy, models.tokenizer, prompts, sampling, max_prompt_length=config.max_prompt_length,
                stop_token_ids=models.chat.stop_ids, device=models.device,
            )  # fmt: skip
            batch = scoring_batch(models.tokenizer, prompts, part, prompt_ids, prompt_mask, response_ids, mask, has_eos)
            scores = models.reward(batch).float().cpu().tolist()
            lengths = mask.sum(dim=1).cpu().tolist()
            for i, record in enumerate(part):
                row = {"prompt": record["prompt"], "response": batch.responses[i], "score": scores[i], "tokens": int(lengths[i]), "eos": bool(has_eos[i])}
                if prompts[i] != record["prompt"]:  # a chat template rendered it: the text the policy saw
                    row["rendered_prompt"] = prompts[i]
                out.append(row)
            advance(len(part), sum(s["score"] for s in out) / len(out))
    grouped = [{"prompt": r["prompt"], "samples": out[i * samples : (i + 1) * samples]} for i, r in enumerate(records)]
    return grouped


def _episodes(models: Models, part: Sequence[dict], start: int, sampling, temperature: float, config) -> list[dict]:
    """``--env``: one episode per row of ``part`` (rows ``start`` ... of the sweep at this
    temperature, each environment seeded by the run's seed, the temperature and the row), its
    return the score."""
    from ..episodes.rollout import transcript_text

    seeds = [derived_seed(config.seed, STAGE, f"{temperature:g}", "env", start + i) for i in range(len(part))]
    drawn = models.episodes.play(models.policy, models.chat, part, seeds, sampling=sampling, max_prompt_length=config.max_prompt_length,
                                 device=models.device)  # fmt: skip
    returns, lengths, turns = drawn.returns().tolist(), drawn.mask.sum(dim=1).tolist(), drawn.turns.tolist()
    return [{"prompt": record["prompt"], "response": transcript_text(drawn.transcripts[i]), "episode": drawn.transcripts[i],
             "score": returns[i], "tokens": int(lengths[i]), "eos": bool(drawn.has_eos[i]), "turns": int(turns[i])}
            for i, record in enumerate(part)]  # fmt: skip


# ---------------------------------------------------------------------------------------
# the stage


def _cache_path(run: RunDir, name: str, temperature: float) -> Path:
    return run.path("bon", name, f"t{temperature:g}.json")


def _cached(path: Path, expected: dict) -> list[dict] | None:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None
    return data["rows"] if data.get("fingerprint") == expected else None


def summarize_temperature(rows: list[dict], ns: Sequence[int]) -> dict[str, Any]:
    scores = [[s["score"] for s in r["samples"]] for r in rows]
    flat = [s for r in rows for s in r["samples"]]
    return {
        "mean_score": sum(s["score"] for s in flat) / len(flat),
        "best_of": estimator.best_of_curve(scores, ns),
        "max_of_all": sum(max(s) for s in scores) / len(scores),
        "mean_tokens": sum(s["tokens"] for s in flat) / len(flat),
        "eos_rate": sum(s["eos"] for s in flat) / len(flat),
    }


def run(config) -> dict[str, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    from ..chat import ChatFormat
    from ..models import load_tokenizer

    ns, temps = check(config)
    samples = max(ns)
    run_dir = RunDir(config.run_dir)
    err = Console(stderr=True)
    policy, default = run_dir.policy(config.policy)
    name = safe_name(config.name) if config.name else default
    function = is_function_spec(config.reward)
    if config.env and (config.reward or config.reward_model):
        raise UserError(f"--{'reward' if config.reward else 'reward-model'} does not apply with --env: an episode's score is its return")
    reward_model = None if function or config.env else config.reward_model or str(run_dir.require("rm"))
    from ..models import check_heads

    for note in check_heads(policy=policy, reward_model=reward_model, allow=config.allow_new_head):
        err.print(note, highlight=False, soft_wrap=True)
    scorer = (f"episodes with {config.env}, scored by their return" if config.env else
              f"reward function {config.reward}" if function else f"reward model {reward_model}")  # fmt: skip
    prompts, source, distinct = load_prompts(config, err)
    if function:  # the fields it needs exist, and a changed file is not served stale scores
        FunctionReward(config.reward).check_records(prompts, f"the records of {source}")
        scored_by = f"{config.reward}@{file_digest(config.reward)}"
    elif config.env:  # a changed environment plays other episodes
        scored_by = f"{config.env}@{file_digest(config.env)}"
    else:
        scored_by = reward_model
    chat = ChatFormat(load_tokenizer(policy, padding_side="left"), config.chat_template)
    rendered = [chat.prompt(r) for r in prompts]
    expected = {t: fingerprint(config, policy, scored_by, rendered, samples, t) for t in temps}
    results = {t: _cached(_cache_path(run_dir, name, t), expected[t]) for t in temps}
    todo = [t for t in temps if results[t] is None]
    err.print(
        f"bon {name}: policy {policy}, {scorer}, {len(prompts)} of the {distinct} distinct eval prompts of {source}, "
        f"{count(samples, 'sample')} per prompt, temperatures {', '.join(f'{t:g}' for t in temps)}"
        + (f" ({len(temps) - len(todo)} already done)" if len(todo) < len(temps) else "")
        + (f"; {note}" if (note := chat.note(prompts)) else ""),  # plain-text prompts need no word
        highlight=False, soft_wrap=True,
    )  # fmt: skip
    if todo:
        from ..generation import compiled  # imports torch: only once every check has passed

        models = load_models(config, policy, reward_model)
        compiled.settle(config, models.policy, rows=config.batch_size, device=models.device,
                                 say=lambda line: err.print(line, highlight=False, soft_wrap=True))  # fmt: skip
        progress = Progress(
            TextColumn("[bold]bon[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TextColumn("<"),
            TimeRemainingColumn(), TextColumn("{task.fields[live]}"), console=err,
        )  # fmt: skip
        with progress:
            task = progress.add_task("bon", total=len(todo) * len(prompts) * samples, live="")
            for t in todo:
                advance = lambda n, mean, t=t: progress.update(task, advance=n, live=f"T={t:g} mean score {mean:.4f}")  # noqa: E731
                results[t] = sample_temperature(models, prompts, t, samples, config, advance)
                artifacts.write_json(_cache_path(run_dir, name, t), {"fingerprint": expected[t], "temperature": t, "rows": results[t]})
    summary = {t: summarize_temperature(results[t], ns) for t in temps}
    curves = {t: summary[t]["best_of"] for t in temps}
    label = ("episode return" if config.env else "reward-function score" if function else
             "normalised reward-model score" if config.normalize else "reward-model score")  # fmt: skip
    plot = plots.best_of_n(curves, run_dir.plot_path(f"bon-{name}"), f"best of N: {name}", ylabel=label)
    best_rows = []
    for t in temps:
        for row in results[t]:
            top = max(row["samples"], key=lambda s: s["score"])
            best_rows.append({"prompt": row["prompt"], "response": top["response"], "score": top["score"], "temperature": t, "samples": samples})
    best_path = artifacts.write_jsonl(run_dir.path("bon", f"{name}-best.jsonl"), best_rows)
    best = {str(n): max(temps, key=lambda t: curves[t][n]["mean"]) for n in ns}
    report = {
        "name": name, "policy": policy, "reward_model": reward_model, "reward": f"env {config.env}" if config.env else config.reward or "model",
        "source": source, "prompts": len(prompts),
        "samples_per_prompt": samples, "n": ns, "temperatures": temps, "normalized": config.normalize,
        "estimator": "unbiased expected maximum of N of M samples without replacement (marlhf_cli.evaluate.estimator)",
        "results": {f"{t:g}": {**summary[t], "best_of": {str(n): v for n, v in summary[t]["best_of"].items()}} for t in temps},
        "best_temperature": best, "plot": str(plot), "chosen": str(best_path), "config": config_module.to_dict(config),
    }  # fmt: skip
    out = artifacts.write_json(run_dir.path("bon", f"{name}.json"), report)
    tables.bon_table(name, curves, {t: summary[t]["mean_score"] for t in temps}, samples, len(prompts),
                     scored="episode return" if config.env else "reward-function score" if function else "reward-model score")  # fmt: skip
    for path in (out, best_path, plot):
        err.print(f"wrote {path}", highlight=False)
    top_n = str(max(ns))
    metrics = {f"best_of_{n}": max(curves[t][n]["mean"] for t in temps) for n in ns} | {"best_temperature": float(best[top_n])}
    run_dir.record_stage(
        f"bon/{name}", config=config_module.to_dict(config),
        inputs={"policy": policy, "reward_model": reward_model, "reward": config.reward or "model", "source": source,
                "prompts": len(prompts), "chat_template": chat.example(prompts)},
        metrics=metrics,
    )  # fmt: skip
    return report


def run_policies(config) -> dict[str, Any]:
    """``--policy A,B,...``: each policy's sweep is a bon run of its own (its own cache,
    outputs and run.json entry, named from the policy), on the same prompts with the same
    seeds; then one table of them side by side and ``bon/<name>.json`` (name ``policies`` by
    default) with each one's figures. With ``--n 1`` at one temperature this is the paper's
    Table 7: every policy's mean reward-model score on the same held-out prompts."""
    policies = list(dict.fromkeys(part.strip() for part in config.policy.split(",") if part.strip()))
    if len(policies) < 2:
        raise UserError(f"--policy {config.policy}: name two policies or more to compare, or one without a comma")
    reports = [run(dataclasses.replace(config, policy=policy, name=None)) for policy in policies]
    tables.policies_table(reports)
    name = safe_name(config.name) if config.name else "policies"
    summary = {
        "policies": [{"policy": r["policy"], "name": r["name"], "results": r["results"]} for r in reports],
        "prompts": reports[0]["prompts"], "source": reports[0]["source"], "n": reports[0]["n"],
        "temperatures": reports[0]["temperatures"], "config": config_module.to_dict(config),
    }  # fmt: skip
    out = artifacts.write_json(RunDir(config.run_dir).path("bon", f"{name}.json"), summary)
    from rich.console import Console

    Console(stderr=True).print(f"wrote {out}", highlight=False)
    return summary
