"""``marlhf segment``: show the macro actions a termination rule makes of any text.

Each response is tokenized once, and the text the rules see is rebuilt from those exact ids
(:func:`marlhf_cli.macro.alignment.token_offsets`), the same path PPO takes for generated
responses, so the preview shows what training would do.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from .errors import UserError, bad_input

from .accepts import rule_list
TEXT_FIELDS = ("response", "text")
HISTOGRAM_BINS = ((1, 1), (2, 2), (3, 3), (4, 5), (6, 10), (11, 20), (21, None))


@dataclass
class Segmented:
    """One response cut into segments by one rule."""

    rule: str
    pieces: list[tuple[str, int]]  # (segment text, its number of LM tokens)
    fell_back: bool = False

    def as_json(self) -> dict:
        return {
            "rule": self.rule,
            "segments": [{"text": text, "tokens": tokens} for text, tokens in self.pieces],
            "fallback": self.fell_back,
        }


@dataclass
class RuleStats:
    rule: str
    cutoff: int = 5  # C: the share of segments longer than it is reported for every rule
    lengths: list[int] = field(default_factory=list)
    # the same segments without the whitespace-only tokens at their ends: what C bounds
    text_lengths: list[int] = field(default_factory=list)
    fallbacks: int = 0
    responses: int = 0
    seconds: float = 0.0

    def histogram(self) -> list[tuple[str, int]]:
        rows = []
        for low, high in HISTOGRAM_BINS:
            label = str(low) if low == high else (f"{low}-{high}" if high else f">={low}")
            count = sum(1 for n in self.lengths if n >= low and (high is None or n <= high))
            rows.append((label, count))
        return rows


# ---------------------------------------------------------------------------------------
# input


def read_responses(source: str) -> list[str]:
    """Responses from a plain-text file (one response), a JSONL file, or '-' for stdin.

    A file is JSONL when its name ends in .jsonl, or when its first non-blank line is a JSON
    object; each line then needs a string 'response' or 'text' field. Empty input (nothing
    but whitespace) is a user error: one line, exit code 2.
    """
    if source == "-":
        raw = sys.stdin.buffer.read()
        name = "<stdin>"
    else:
        path = Path(source)
        if path.is_dir():
            raise bad_input("is a folder: give a text or JSONL file, or - to read stdin", path)
        if not path.is_file():
            raise bad_input("file not found", path)
        raw = path.read_bytes()
        name = str(path)
    try:
        content = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise bad_input(f"invalid UTF-8 at byte {err.start}", name, line) from None
    if not content.strip():  # said, not a silent exit 0: an empty pipe is usually a mistake upstream
        raise bad_input("empty input: no text to segment", name)
    if _looks_like_jsonl(name, content):
        return list(_jsonl_responses(name, content))
    return [content]


def _looks_like_jsonl(name: str, content: str) -> bool:
    if name.endswith(".jsonl"):
        return True
    first = next((line for line in content.splitlines() if line.strip()), "")
    if not first.lstrip().startswith("{"):
        return False
    try:
        return isinstance(json.loads(first), dict)
    except json.JSONDecodeError:
        return False


def _jsonl_responses(name: str, content: str) -> Iterable[str]:
    for number, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise bad_input(f"malformed JSON ({err.msg})", name, number) from None
        if not isinstance(row, dict):
            raise bad_input("expected a JSON object", name, number)
        key = next((k for k in TEXT_FIELDS if k in row), None)
        if key is None:
            raise bad_input("missing (expected 'response' or 'text')", name, number, "response")
        if not isinstance(row[key], str):
            raise bad_input(f"expected a string, got {type(row[key]).__name__}", name, number, key)
        yield row[key]


# ---------------------------------------------------------------------------------------
# segmentation


def reference_logprobs(model, ids_per_response: list[list[int]], start_id: int) -> list[list[float]]:
    """Log-probability of each response token under ``model`` (for the ppl rule).

    ``start_id`` (the tokenizer's BOS, or EOS where there is none, as GPT-2 does) conditions
    the first token, so every response token gets a log-prob.
    """
    import torch

    results = []
    with torch.no_grad():
        for ids in ids_per_response:
            context = torch.tensor([[start_id] + ids])
            logp = torch.log_softmax(model(input_ids=context).logits[0, :-1].float(), dim=-1)
            results.append(logp.gather(1, context[0, 1:, None])[:, 0].tolist())
    return results


def segment_responses(
    responses: list[str],
    rules: list[str],
    *,
    tokenizer,
    n: float,
    cutoff: int,
    seed: int,
    backend: str = "auto",
    model=None,
) -> tuple[list[list[Segmented]], dict[str, RuleStats]]:
    """Cut every response with every rule; returns per-response results and per-rule stats."""
    from .macro import TerminationRule, segment_lengths
    from .macro.alignment import token_offsets

    ids_per_response = [tokenizer(text, add_special_tokens=False)["input_ids"] for text in responses]
    decoded = [token_offsets(tokenizer, ids) for ids in ids_per_response]
    ref_logprobs = None
    if "ppl" in rules:
        if model is None:
            raise UserError("the ppl rule needs a model (--model)")
        start_id = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        ref_logprobs = reference_logprobs(model, ids_per_response, start_id)

    stats = {}
    results: list[list[Segmented]] = [[] for _ in responses]
    for rule_name in rules:
        rule = TerminationRule(rule_name, n=n, cutoff=cutoff, seed=seed, backend=backend)
        rule_stats = stats[rule_name] = RuleStats(rule_name, cutoff=rule.cutoff)
        if rule.needs_text:
            # load the parser before the clock starts: tokens/s measures the rule itself
            segment_lengths(rule, 1, text="a", offsets=[(0, 1)])
        started = time.perf_counter()
        for index, (text, offsets) in enumerate(decoded):
            lengths, fell_back = segment_lengths(
                rule,
                len(offsets),
                text=text,
                offsets=offsets,
                ref_logprobs=ref_logprobs[index] if ref_logprobs is not None else None,
                sample_seed=seed + index,
            )
            results[index].append(Segmented(rule_name, _pieces(text, offsets, lengths), fell_back))
            rule_stats.lengths.extend(lengths)
            rule_stats.text_lengths.extend(lengths_without_whitespace(text, offsets, lengths))
            rule_stats.fallbacks += int(fell_back)
            rule_stats.responses += 1
        rule_stats.seconds = time.perf_counter() - started
    return results, stats


def _pieces(text: str, offsets: list[tuple[int, int]], lengths: list[int]) -> list[tuple[str, int]]:
    """Segment texts: each runs from its first token's start to the next segment's start."""
    pieces = []
    first = 0
    for length in lengths:
        last = first + length
        start = offsets[first][0] if first else 0
        end = offsets[last][0] if last < len(offsets) else len(text)
        pieces.append((text[start:end], length))
        first = last
    return pieces


def lengths_without_whitespace(text: str, offsets: list[tuple[int, int]], lengths: list[int]) -> list[int]:
    """Each segment's length once the whitespace-only (or empty) tokens at its ends are set
    aside: the length the parsing rule's bound C applies to (docs/method.md "Termination rules")."""
    blank = [not text[start:end].strip() for start, end in offsets]
    result, first = [], 0
    for length in lengths:
        inside = [i for i in range(first, first + length) if not blank[i]]
        result.append(inside[-1] - inside[0] + 1 if inside else 0)
        first += length
    return result


def summarise(stats: RuleStats) -> dict:
    lengths = stats.lengths
    over = sum(1 for n in stats.text_lengths if n > stats.cutoff)
    return {
        "rule": stats.rule,
        "responses": stats.responses,
        "segments": len(lengths),
        "tokens": sum(lengths),
        "mean": statistics.fmean(lengths) if lengths else 0.0,
        "median": statistics.median(lengths) if lengths else 0.0,
        "max": max(lengths, default=0),
        "max_without_whitespace": max(stats.text_lengths, default=0),
        "cutoff": stats.cutoff,
        "over_cutoff": over / len(lengths) if lengths else 0.0,
        "fallbacks": stats.fallbacks,
        "tokens_per_second": sum(lengths) / stats.seconds if stats.seconds > 0 else None,
        "histogram": dict(stats.histogram()),
    }


# ---------------------------------------------------------------------------------------
# the command


def check_parser(backend: str) -> None:
    """One-line error, before anything is loaded, when the parsing rule cannot run."""
    from .macro import TerminationRule, missing_parser

    try:
        rule = TerminationRule("parsing", backend=backend)
    except ValueError as err:
        raise UserError(f"--backend: {err}") from None
    missing = missing_parser(rule)
    if missing:
        raise UserError(f"--rule parsing needs a parser: {missing}")


def run(config, source: str) -> None:
    """What ``marlhf segment`` does: read, segment with each rule, print."""
    from .models import load_causal_lm, load_tokenizer

    rules = rule_list(config.rule)  # checked with the options (accepts.ACCEPTS)
    if "turn" in rules:  # a conversation's turns, not a text's tokens (segment_turns.py)
        if len(rules) > 1:
            raise UserError("--rule turn cuts conversations into their assistant turns: give it alone")
        from .segment_turns import read_conversations, show

        conversations = read_conversations(source)
        show(conversations, tokenizer=load_tokenizer(config.tokenizer), as_json=config.format == "json", stats=config.stats,
             mark=MARK, styles=SEGMENT_STYLES)  # fmt: skip
        return
    if "parsing" in rules:
        check_parser(config.backend)
    responses = read_responses(source)
    tokenizer = load_tokenizer(config.tokenizer)
    model = None
    if "ppl" in rules:
        model = load_causal_lm(config.model)
        if model.config.vocab_size < len(tokenizer):
            raise UserError(
                f"--model '{config.model}' does not share the vocabulary of --tokenizer '{config.tokenizer}'"
            )
    results, stats = segment_responses(
        responses, rules, tokenizer=tokenizer, n=config.n, cutoff=config.cutoff,
        seed=config.seed, backend=config.backend, model=model,
    )
    if "parsing" in rules:  # which parser ran: a stanza install and a spaCy one cut differently
        from .macro.parsing import backend_description

        print(f"parsing: {backend_description(config.backend)}", file=sys.stderr)
    if config.stats:
        print_stats([summarise(stats[name]) for name in rules], as_json=config.format == "json")
    elif config.format == "json":
        for per_rule in results:
            for segmented in per_rule:
                print(json.dumps(segmented.as_json(), ensure_ascii=False))
    else:
        print_segments(results, show_rule=len(rules) > 1)
        for note in fallback_notes(results, config.n):
            print(f"note: {note}", file=sys.stderr)


def fallback_notes(results: list[list[Segmented]], n: float) -> list[str]:
    """Per rule, which responses fell back to ``fixed`` (text mode shows only the segments;
    JSON has a 'fallback' field and --stats a column)."""
    notes = []
    rules = [segmented.rule for segmented in results[0]] if results else []
    for position, rule in enumerate(rules):
        failed = [index + 1 for index, per_rule in enumerate(results) if per_rule[position].fell_back]
        if not failed:
            continue
        if len(results) == 1:
            notes.append(f"{rule}: the response could not be parsed, so fixed (n={n:g}) cut it")
            continue
        shown = ", ".join(map(str, failed[:10])) + (", ..." if len(failed) > 10 else "")
        notes.append(
            f"{rule}: {len(failed)} of {len(results)} responses could not be parsed, so fixed (n={n:g}) cut "
            f"{'them' if len(failed) > 1 else 'it'} (response{'s' if len(failed) > 1 else ''} {shown})"
        )
    return notes


# ---------------------------------------------------------------------------------------
# output

SEGMENT_STYLES = ("bold cyan", "bold magenta")
MARK = "@@"


def split_trailing_space(text: str) -> tuple[str, str]:
    """A segment's text and its trailing whitespace: '@@' goes between them, as in the
    paper's examples (``def queue_time(customers, n):@@``), though the whitespace tokens
    belong to the segment."""
    visible = text.rstrip()
    return visible, text[len(visible):]


def print_segments(results: list[list[Segmented]], show_rule: bool) -> None:
    """Each response with @@ after every segment; alternating colours on a terminal."""
    from rich.console import Console
    from rich.text import Text

    console = Console(highlight=False, soft_wrap=True)
    for index, per_rule in enumerate(results):
        if index:
            console.print()
        for segmented in per_rule:
            if show_rule:
                note = " (parse failed: fixed fallback)" if segmented.fell_back else ""
                console.print(Text(f"[{segmented.rule}{note}]", style="dim"))
            line = Text()
            for number, (text, _) in enumerate(segmented.pieces):
                visible, trailing = split_trailing_space(text)
                line.append(visible, style=SEGMENT_STYLES[number % 2])
                line.append(MARK + trailing, style="dim")
            console.print(line)


def print_stats(summaries: list[dict], as_json: bool) -> None:
    """The statistics, then the length histogram, each with one column per rule: the five
    rules fit 80 columns side by side, eight statistics would not."""
    if as_json:
        for summary in summaries:
            print(json.dumps(summary))
        return
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    table = Table(title="segment lengths (LM tokens) per rule")
    table.add_column("", justify="right")
    for s in summaries:
        table.add_column(s["rule"], justify="right")
    rows = {
        "responses": lambda s: f"{s['responses']:,}", "segments": lambda s: f"{s['segments']:,}",
        "mean": lambda s: f"{s['mean']:.2f}", "median": lambda s: f"{s['median']:g}", "max": lambda s: f"{s['max']:,}",
        "fallbacks": lambda s: f"{s['fallbacks']:,}",
        "tokens/s": lambda s: f"{s['tokens_per_second']:,.0f}" if s["tokens_per_second"] else "-",
    }  # fmt: skip
    for label, cell in rows.items():
        table.add_row(label, *(cell(s) for s in summaries))
    console.print(table)
    histogram = Table(title="segments per length")
    histogram.add_column("length", justify="right")
    for s in summaries:
        histogram.add_column(s["rule"], justify="right")
    for label in summaries[0]["histogram"] if summaries else []:
        histogram.add_row(label, *(f"{s['histogram'][label]:,}" for s in summaries))
    # the bound of the parsing rule, shown for every rule (whitespace-only tokens at a
    # segment's ends aside, as the rule's C is defined)
    histogram.add_section()
    histogram.add_row("C", *(str(s["cutoff"]) for s in summaries))
    histogram.add_row("largest*", *(str(s["max_without_whitespace"]) for s in summaries))
    histogram.add_row("> C*", *(f"{s['over_cutoff']:.1%}" for s in summaries))
    histogram.caption = "* whitespace at a segment's ends aside"
    console.print(histogram)
