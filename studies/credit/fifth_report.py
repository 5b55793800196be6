"""The fifth edition's pilot report, from its committed records alone (:mod:`.fifth`)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path


def _read(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _records(root: Path, phase: str) -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted((root / phase).glob("*.json"))]


def _machine(record: dict) -> str:
    cpu = record.get("provenance", {}).get("cpu", {})
    flags = " ".join(f for f in cpu.get("flags", []) if f.startswith(("avx512_bf16", "amx")))
    return f"{cpu.get('model', 'unknown CPU')}" + (f" ({flags})" if flags else "") + f", {record.get('threads')} torch thread(s)"


def gate1_passable(gate: dict) -> bool:
    """Whether any reward model of the grid passed gate 1's test on the pilot's validation pairs."""
    return any(result["passed"] for result in gate["by_lr"].values())


def _training_hours(models: dict) -> float:
    runs = [models["sft"], *models["rm"].values()]
    return sum(run["steps"] * run["seconds_per_step"] for run in runs) / 3600


def pilot_lines(settings: dict, root: Path) -> list[str]:
    out = [f"# Credit study, fifth edition: the pilot ({settings['mode']}, pilot hash {settings['digest']})", "",
           "A pilot, reported as one: it measures whether the edition's gates can be passed and what a run costs, on data "
           "disjoint from every test pair and test prompt. Nothing here is evidence about credit assignment.", ""]  # fmt: skip
    data = _read(root / "data.json")
    if data is None:
        return out + ["No records yet: the pilot has not prepared its data."]
    out += [f"Machine: {_machine(data)}; commit {data['provenance'].get('commit')}.", "", "## Data", "",
            f"- {data['pairs']} HH pairs from {data['source']} ({', '.join(f'{k} {v}' for k, v in data['by_source'].items())}), "
            f"{data['conversations']} conversations; left out: {', '.join(f'{v} {k}' for k, v in data['skipped'].items())}.",
            f"- By conversation: test {data['test_pairs']} pairs ({data['test_prompts']} prompts, read by no stage and not by "
            f"the pilot), SFT {data['sft_pairs']}, RM {data['rm_pairs']} (the pilot's training {data['pilot_train_pairs']}, "
            f"validation {data['pilot_val_pairs']}), PPO {data['ppo_pairs']}; {data['prompts_cut_to_fit']} dialogues cut "
            f"to their last turns that fit {settings['data']['prompt_tokens']} tokens.",
            "- Length rules on the pilot's validation pairs: " + ", ".join(f"{rule} wins {share:.3f}" for rule, share in
                                                                          data["pilot_val_length_rules"].items()) + "."]  # fmt: skip
    models = _read(root / "models.json")
    if models is None:
        return out + ["", "The models are not trained yet."]
    sft = models["sft"]
    out += ["", "## Models", "", f"- SFT: {sft['steps']} steps, held-out loss {sft['eval_loss']:.3f}, {sft['seconds_per_step']:.1f} s/step.",
            *[f"- RM at lr {lr}: {m['steps']} steps, the stage's own held-out accuracy {m['eval_accuracy']:.3f} on "
              f"{m['eval_pairs']:.0f} pairs, {m['seconds_per_step']:.1f} s/step." for lr, m in models["rm"].items()],
            # the steps' own time: a phase resumed after a restart records only its last session's wall time
            f"- Their training steps took {_training_hours(models):.2f} h (steps x seconds per step)."]  # fmt: skip
    gate = _read(root / "rm-gate.json")
    if gate is None:
        return out
    bar, alpha = settings["gate1"]["accuracy"], settings["gate1"]["alpha"]
    out += ["", f"## Gate 1's figures, on the pilot's validation pairs (bar: accuracy >= {bar}, beating the better length "
            f"rule by a one-sided exact McNemar test at {alpha})", "",
            "| RM lr | pairs | accuracy (95% Wilson) | length rule | its accuracy | RM only / rule only | p | length-controlled | passes |",
            "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for lr, g in gate["by_lr"].items():
        low, high = g["accuracy_interval"]
        out.append(f"| {lr} | {g['pairs']} | {g['accuracy']:.3f} ({low:.3f}-{high:.3f}) | {g['length_rule']} wins | "
                   f"{g['length_accuracy']:.3f} | {g['rm_only']} / {g['length_only']} | {g['p_value']:.3g} | "
                   f"{g['length_controlled']:.3f} | {'yes' if g['passed'] else 'no'} |")  # fmt: skip
    if not gate1_passable(gate):
        best = max(gate["by_lr"].values(), key=lambda g: g["accuracy"])
        out += ["", f"**Gate 1 cannot be passed at this scale: the pilot stops here** (issue 55: a gate that cannot be "
                f"passed is a result). The better reward model is right on {best['accuracy']:.3f} of the validation pairs, "
                f"against the bar of {bar} and the better length rule's {best['length_accuracy']:.3f}; no critic or PPO "
                f"figure below it is a gate-2 reading of a reward model the edition could use."]  # fmt: skip
    else:
        out += ["", f"The pilot goes on with the reward model at lr {gate['picked_rm_lr']:g} (the better validation accuracy)."]
    critic = _records(root, "critic")
    warmup = settings["ppo"]["warmup_steps"]
    if critic:
        out += ["", f"## Gate 2's figure: the critic's pooled explained variance over the {warmup} warm-up steps (bar {settings['critic']['gate']})", ""]
        for record in sorted(critic, key=lambda r: r["critic_lr"]):
            row = next((r for r in record["train"] if r["step"] == warmup), {})
            out.append(f"- critic lr {record['critic_lr']:g}: {row.get('explained_variance_pooled', math.nan):.3f} "
                       f"(median step {statistics.median(r['step_time'] for r in record['train']):.0f} s)")  # fmt: skip
    for record in _records(root, "curve"):
        steps = [r["step"] for r in record["eval"]]
        out += ["", f"## One token-PPO run: actor lr {record['lr']:g}, critic lr {record['critic_lr']:g}, seed {record['seed']}, "
                f"{record['steps']} steps ({warmup} of them the critic's warm-up)", "",
                "| step | " + " | ".join(map(str, steps)) + " |", "|---|" + "---|" * len(steps),
                "| held-out RM score | " + " | ".join(f"{r['score']:.3f}" for r in record["eval"]) + " |",
                "| response tokens | " + " | ".join(f"{r['response_length']:.0f}" for r in record["eval"]) + " |", ""]  # fmt: skip
        times = [r["step_time"] for r in record["train"]]
        out += [f"Cost: {statistics.median(times):.0f} s per step (median; {min(times):.0f}-{max(times):.0f}), "
                f"{record['seconds'] / 3600:.2f} h for the run with its evaluations, on {_machine(record)}."]  # fmt: skip
    return out
