"""The fourth edition's data: TL;DR posts and comparisons split by post, prompts cut to fit.

Sources (read by path; nothing of them is committed):

* ``comparisons``: human comparisons (post, subreddit, title, chosen, rejected), several per
  post; from ``../shared/data/tldr/comparisons.jsonl`` (OpenAI's summarize-from-feedback
  validation batches). Split by post into the reward model's training pairs and its **test
  pairs** (gate 1).
* ``references``: posts with a human reference summary, from
  ``../shared/data/tldr/posts-with-reference.jsonl``. The posts of the test pairs are left out,
  so **no stage ever trains on a test post**; the rest is shuffled and dealt into the **PPO
  posts** (a fixed count: the PPO stage holds out 10% of them by post, as it does with any
  file, and evaluates on the first ``--eval-prompts`` of those) and the **SFT demonstrations**
  (the rest; the SFT stage holds out 10% for its held-out loss).

Where ``../shared`` is absent (the end-to-end test), the embedded TL;DR sample stands in for
both: its comparisons, and each of its posts with its first preferred summary as reference.

Every prompt is the paper's TL;DR format (``marlhf_cli.data.tldr.format_prompt``) and fits in
``prompt_tokens`` tokens of the policy's tokenizer: a longer post is cut at a word boundary,
keeping its start (the stages would otherwise keep a long prompt's end and drop the
subreddit and title). The derived files are written in the flat and reference row shapes the
``tldr`` adapter reads (``--dataset tldr --data-file FILE``), as a user would prepare their
own files.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from marlhf_cli.data.splits import assign_splits
from marlhf_cli.data.tldr import format_prompt


@dataclass(frozen=True)
class Files:
    """The derived files of one preparation."""

    sft: Path  # reference rows: post, subreddit, title, summary
    rm_train: Path  # flat comparison rows: post, subreddit, title, chosen, rejected
    rm_test: Path
    ppo: Path  # reference rows (the summary unused: PPO reads the prompt)


def read_jsonl(path: Path) -> list[dict]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def write_jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")


def _longest_start(text: str, fits) -> str:
    """The most words from ``text``'s start (cut at spaces) for which ``fits`` holds."""
    words = text.split(" ")
    low, high = 0, len(words)
    while low < high:
        middle = (low + high + 1) // 2
        if fits(" ".join(words[:middle])):
            low = middle
        else:
            high = middle - 1
    return " ".join(words[:low]).rstrip()


def fit_post(row: dict, tokenizer, budget: int) -> dict:
    """``row`` with its post cut (at a word boundary, keeping the start) so that its formatted
    prompt is at most ``budget`` tokens; where even an empty post does not fit, its title is
    cut too. Unchanged (but stripped) when it fits."""

    def length(title: str, post: str) -> int:
        return len(tokenizer(format_prompt(row["subreddit"], title, post), add_special_tokens=False)["input_ids"])

    title, post = row["title"].strip(), row["post"].strip()
    if length(title, post) > budget:
        post = _longest_start(post, lambda p: length(title, p) <= budget)
        if length(title, post) > budget:
            title = _longest_start(title, lambda t: length(t, "") <= budget)
    return {**row, "title": title, "post": post}


def read_sources(shared: Path | None) -> tuple[list[dict], list[dict], str]:
    """(comparisons, references, what they are): ``shared``'s TL;DR files, or the embedded
    sample where ``shared`` is None or lacks them."""
    if shared is not None and (shared / "comparisons.jsonl").is_file() and (shared / "posts-with-reference.jsonl").is_file():
        return read_jsonl(shared / "comparisons.jsonl"), read_jsonl(shared / "posts-with-reference.jsonl"), str(shared)
    from marlhf_cli.data.registry import SAMPLES_DIR

    comparisons, references, seen = [], [], set()
    for row in read_jsonl(SAMPLES_DIR / "tldr.jsonl"):
        info, summaries = row["info"], [s["text"] for s in row["summaries"]]
        post = {"post": info["post"], "subreddit": info["subreddit"], "title": info["title"]}
        chosen, rejected = summaries[row["choice"]], summaries[1 - row["choice"]]
        comparisons.append({**post, "chosen": chosen, "rejected": rejected})
        if info["post"] not in seen:
            seen.add(info["post"])
            references.append({**post, "summary": chosen})
    return comparisons, references, "the embedded TL;DR sample"


def prepare(comparisons: list[dict], references: list[dict], out: Path, tokenizer, *, prompt_tokens: int,
            rm_test_share: float, ppo_posts: int, seed: int) -> tuple[Files, dict]:  # fmt: skip
    """Write the derived files under ``out``; returns them and a summary of the counts."""
    budget = prompt_tokens

    # the reward model's pairs, split by post (the data layer's own split: whole groups, seeded)
    groups = [row["post"].strip() for row in comparisons]
    where = assign_splits(groups, {"rm_train": 1.0 - rm_test_share, "rm_test": rm_test_share}, seed)
    keep = ("post", "subreddit", "title", "chosen", "rejected")
    pairs: dict[str, list[dict]] = {"rm_train": [], "rm_test": []}
    for row, split in zip(comparisons, where):
        pairs[split].append(fit_post({k: row[k] for k in keep}, tokenizer, budget))
    test_posts = {post for post, split in zip(groups, where) if split == "rm_test"}

    # posts with a reference summary, but for the test pairs': PPO prompts and SFT demonstrations
    free = [row for row in references if row["post"].strip() not in test_posts]
    order = list(range(len(free)))
    random.Random(seed).shuffle(order)
    shuffled = [fit_post({k: free[i][k] for k in ("post", "subreddit", "title", "summary")}, tokenizer, budget) for i in order]
    ppo_rows, sft_rows = shuffled[:ppo_posts], shuffled[ppo_posts:]

    files = Files(out / "sft.jsonl", out / "rm-train.jsonl", out / "rm-test.jsonl", out / "ppo.jsonl")
    for path, rows in ((files.sft, sft_rows), (files.rm_train, pairs["rm_train"]), (files.rm_test, pairs["rm_test"]),
                       (files.ppo, ppo_rows)):  # fmt: skip
        write_jsonl(path, rows)
    originals = {row["post"].strip() for row in comparisons + references}
    cut = sum(1 for rows in (sft_rows, ppo_rows, *pairs.values()) for row in rows if row["post"] not in originals)
    summary = {
        "comparison_pairs": len(comparisons), "comparison_posts": len(set(groups)),
        "rm_train_pairs": len(pairs["rm_train"]), "rm_test_pairs": len(pairs["rm_test"]),
        "rm_train_posts": len({r["post"] for r in pairs["rm_train"]}), "rm_test_posts": len(test_posts),
        "reference_posts": len(references), "reference_posts_left_out": len(references) - len(free),
        "sft_demonstrations": len(sft_rows), "ppo_posts": len(ppo_rows),
        "rows_whose_post_was_cut": cut,
    }  # fmt: skip
    return files, summary
