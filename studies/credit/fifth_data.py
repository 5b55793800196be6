"""The fifth edition's data: HH-RLHF dialogue pairs split by conversation, prompts cut to fit.

Sources (read by path; nothing of them is committed): Anthropic's raw harmless-base and
helpful-base transcripts in ``../shared/data/hh-rlhf`` (each row a ``chosen`` and a ``rejected``
transcript), read with marlhf's own HH parser: a row whose two transcripts diverge before
their last assistant turn, or whose two responses are the same, is left out and counted, as
``marlhf rm`` does.

A conversation is named by its first human turn, and every split takes whole conversations
(the data layer's seeded :func:`~marlhf_cli.data.splits.assign_splits`), so no prompt of the
**test** split (pairs for gate 1, prompts for the final evaluation) is ever trained on by
any stage, the pilot included. The rest is dealt into the paper's 20/40/40 shares for SFT
(the chosen responses as demonstrations), the reward model (pairs) and PPO (its prompts; its
pairs, which PPO never reads, train the second reward model, the edition's independent
judge). The pilot splits the reward model's share once more by conversation into its own
training and validation pairs: it measures on data the edition never tests on.

A dialogue longer than ``prompt_tokens`` keeps its last whole turns (at least its last human
turn): the stages would otherwise cut it mid-sentence at the token budget. A last human turn
longer than the budget is left for the stages to cut (they keep a prompt's end). The files are
flat ``prompt``/``chosen``/``rejected`` rows, which ``--dataset hh --data-file FILE`` reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from marlhf_cli.data.hh import ASSISTANT, HUMAN, split_transcript
from marlhf_cli.data.splits import assign_splits

from .fourth_data import read_jsonl, write_jsonl

SOURCES = ("harmless-base", "helpful-base")
SHARES = ("sft", "rm", "ppo")  # of the conversations that are not test ones, in the paper's 20/40/40


@dataclass(frozen=True)
class Files:
    """The derived files of one preparation (flat prompt/chosen/rejected rows)."""

    sft: Path  # the SFT share: its chosen responses are the demonstrations
    rm_train: Path  # the reward model's share
    rm_test: Path  # the test split's pairs (gate 1)
    ppo: Path  # the PPO share: its prompts for PPO, its pairs for the second reward model
    test_prompts: Path  # the test split's prompts, once each (the final evaluation)
    pilot_train: Path  # the reward model's share, split again for the pilot
    pilot_val: Path


def files_under(folder: Path) -> Files:
    names = ("sft", "rm-train", "rm-test", "ppo", "test-prompts", "pilot-rm-train", "pilot-rm-val")
    return Files(*(folder / f"{name}.jsonl" for name in names))


def first_human_turn(prompt: str) -> str:
    """The text of a dialogue's first human turn: the name of its conversation."""
    start = prompt.find(HUMAN)
    body = prompt[start + len(HUMAN) :] if start >= 0 else prompt
    return body.split(ASSISTANT, 1)[0].strip()


def read_pairs(shared: Path | None) -> tuple[list[dict], dict, str]:
    """(pairs, counts of rows left out by reason, what they are): every usable HH row of
    ``shared``'s two samples as {prompt, chosen, rejected, source}; the embedded HH sample
    where ``shared`` is None or lacks them."""
    files = [shared / f"{name}-sample.jsonl" for name in SOURCES] if shared is not None else []
    if not files or not all(path.is_file() for path in files):
        from marlhf_cli.data.registry import SAMPLES_DIR

        files, where = [SAMPLES_DIR / "hh.jsonl"], "the embedded HH sample"
    else:
        where = str(shared)
    pairs, skipped = [], {"prompt mismatch": 0, "same responses": 0}
    for path in files:
        for row in read_jsonl(path):
            if "prompt" in row:  # the embedded sample's flat rows
                prompt, chosen, rejected = row["prompt"], row["chosen"], row["rejected"]
            else:
                prompt, chosen = split_transcript(row["chosen"])
                other, rejected = split_transcript(row["rejected"])
                if other != prompt:
                    skipped["prompt mismatch"] += 1
                    continue
            if chosen.strip() == rejected.strip():
                skipped["same responses"] += 1
                continue
            pairs.append({"prompt": prompt, "chosen": chosen, "rejected": rejected, "source": path.stem.removesuffix("-sample")})
    return pairs, skipped, where


def fit_dialogue(prompt: str, tokenizer, budget: int) -> str:
    """``prompt`` with its earliest turns dropped until it fits ``budget`` tokens, turn by turn
    (a human turn and the assistant's answer after it go together); the last human turn is
    always kept, even when it alone is longer (the stages then cut it, keeping its end)."""

    def length(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    starts = [i for i in range(len(prompt)) if prompt.startswith(HUMAN, i)]
    for start in starts:
        if length(prompt[start:]) <= budget:
            return prompt[start:]
    return prompt[starts[-1] :] if starts else prompt


def prepare(pairs: list[dict], out: Path, tokenizer, *, prompt_tokens: int, test_share: float, pilot_val_share: float,
            seed: int) -> tuple[Files, dict]:  # fmt: skip
    """Write the derived files under ``out``; returns them and a summary of the counts."""
    groups = [first_human_turn(pair["prompt"]) for pair in pairs]
    rest = 1.0 - test_share
    shares = {"test": test_share, "sft": 0.2 * rest, "rm": 0.4 * rest, "ppo": 0.4 * rest}
    where = assign_splits(groups, shares, seed)
    rows: dict[str, list[dict]] = {name: [] for name in shares}
    cut = 0
    for pair, split in zip(pairs, where):
        prompt = fit_dialogue(pair["prompt"], tokenizer, prompt_tokens)
        cut += prompt != pair["prompt"]
        rows[split].append({**pair, "prompt": prompt})
    rm_groups = [first_human_turn(row["prompt"]) for row in rows["rm"]]
    pilot = assign_splits(rm_groups, {"train": 1.0 - pilot_val_share, "val": pilot_val_share}, seed + 1)
    pilot_rows = {name: [row for row, split in zip(rows["rm"], pilot) if split == name] for name in ("train", "val")}
    test_prompts = list({row["prompt"]: {"prompt": row["prompt"], "source": row["source"]} for row in rows["test"]}.values())

    files = files_under(out)
    for path, part in ((files.sft, rows["sft"]), (files.rm_train, rows["rm"]), (files.rm_test, rows["test"]),
                       (files.ppo, rows["ppo"]), (files.test_prompts, test_prompts), (files.pilot_train, pilot_rows["train"]),
                       (files.pilot_val, pilot_rows["val"])):  # fmt: skip
        write_jsonl(path, part)
    summary = {
        "pairs": len(pairs), "conversations": len(set(groups)),
        **{f"{name}_pairs": len(part) for name, part in rows.items()},
        **{f"{name}_conversations": len({g for g, s in zip(groups, where) if s == name}) for name in shares},
        "test_prompts": len(test_prompts), "pilot_train_pairs": len(pilot_rows["train"]),
        "pilot_val_pairs": len(pilot_rows["val"]), "prompts_cut_to_fit": cut,
        "by_source": {source: sum(1 for p in pairs if p["source"] == source) for source in sorted({p["source"] for p in pairs})},
    }  # fmt: skip
    return files, summary


def digest(files: Files) -> str:
    """A short hash of the derived files' contents: what the records' data provenance names."""
    import hashlib

    hashed = hashlib.sha256()
    for path in (files.sft, files.rm_train, files.rm_test, files.ppo, files.test_prompts, files.pilot_train, files.pilot_val):
        hashed.update(path.name.encode())
        hashed.update(path.read_bytes())
    return hashed.hexdigest()[:12]


def lengths(rows: list[dict], tokenizer) -> dict[str, list[int]]:
    """The chosen and rejected responses' lengths in tokens (the length rules read them)."""
    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return {"chosen": [count(r["chosen"]) for r in rows], "rejected": [count(r["rejected"]) for r in rows]}


__all__ = ["Files", "files_under", "first_human_turn", "read_pairs", "fit_dialogue", "prepare", "digest", "lengths"]
