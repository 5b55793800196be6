"""``marlhf segment --rule turn``: a conversation's macro actions when each assistant turn is one
(``ppo --env ... --termination turn``), the other turns shown as what the policy reads.

Input: a JSON Lines file whose rows hold the conversation as a list of ``{"role", "content"}``
messages under ``messages``, ``conversation`` or ``episode`` (what ``ppo --env`` writes to
``samples/<name>.jsonl``); or a text in the HH transcript's form (``Human: ... Assistant:
...``), one conversation.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from .errors import bad_input

KEYS = ("episode", "messages", "conversation")  # an episode first: a sample row may hold its prompt turns too
_SPEAKER = re.compile(r"\n\n(Human|Assistant):")


def read_conversations(source: str) -> list[list[dict]]:
    """The conversations of ``source`` (module docstring); a one-line error for anything else."""
    name = "<stdin>" if source == "-" else source
    if source == "-":
        content = sys.stdin.read()
    else:
        path = Path(source)
        if not path.is_file():
            raise bad_input("is a folder" if path.is_dir() else "file not found", path)
        content = path.read_text(encoding="utf-8", errors="strict")
    if not content.strip():
        raise bad_input("empty input: no conversation", name)
    if name.endswith(".jsonl") or content.lstrip().startswith("{"):
        return [_messages(name, number, line) for number, line in enumerate(content.splitlines(), start=1) if line.strip()]
    return [_transcript(name, content)]


def _messages(name: str, number: int, line: str) -> list[dict]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise bad_input(f"malformed JSON ({err.msg})", name, number) from None
    key = next((k for k in KEYS if isinstance(row, dict) and k in row), None)
    if key is None:
        raise bad_input(f"no conversation (expected a list of messages under {', '.join(KEYS)})", name, number)
    messages = row[key]["prompt"] if isinstance(row[key], dict) and "prompt" in row[key] else row[key]
    if not isinstance(messages, list) or not all(isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role")
                                                  for m in messages):  # fmt: skip
        raise bad_input("expected a list of {role, content} messages", name, number, key)
    return messages


def _transcript(name: str, text: str) -> list[dict]:
    parts = _SPEAKER.split("\n\n" + text.strip() if not text.startswith("\n\n") else text)
    if len(parts) < 3:
        raise bad_input("not a conversation: expected Human: and Assistant: turns, or a JSONL file of messages", name)
    return [{"role": "user" if who == "Human" else "assistant", "content": said.strip()} for who, said in zip(parts[1::2], parts[2::2])]


def show(conversations: list[list[dict]], *, tokenizer, as_json: bool, stats: bool, mark: str, styles: tuple[str, str]) -> None:
    """Each conversation with ``mark`` (segment.py's ``@@``) after every assistant turn (one macro
    action each, in ``styles`` by turns) and the other turns dim, as read; or its JSON; or the counts."""
    from rich.console import Console
    from rich.text import Text

    if stats:
        turns = [m for c in conversations for m in c if m["role"] == "assistant"]
        tokens = [len(tokenizer(m["content"], add_special_tokens=False)["input_ids"]) for m in turns]
        mean = sum(tokens) / len(tokens) if tokens else 0.0
        summary = {"rule": "turn", "conversations": len(conversations), "segments": len(turns), "tokens": sum(tokens),
                   "mean": mean, "max": max(tokens, default=0)}  # fmt: skip
        print(json.dumps(summary) if as_json else
              f"turn: {summary['conversations']} conversations, {summary['segments']} assistant turns (macro actions), "
              f"{summary['mean']:.1f} tokens each on average, {summary['max']} at most")  # fmt: skip
        return
    console = Console(highlight=False, soft_wrap=True)
    for index, conversation in enumerate(conversations):
        if as_json:
            print(json.dumps({"rule": "turn", "turns": [{**m, "macro_action": m["role"] == "assistant"} for m in conversation]},
                             ensure_ascii=False))  # fmt: skip
            continue
        if index:
            console.print()
        acted = 0
        for message in conversation:
            if message["role"] == "assistant":
                line = Text(message["content"].rstrip(), style=styles[acted % 2])
                line.append(mark, style="dim")
                acted += 1
            else:
                line = Text(f"[{message['role']}] {message['content'].strip()}", style="dim")
            console.print(line)
