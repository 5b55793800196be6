"""A user's own file in TRL's dataset conventions -> records, with no code to write.

Row shapes understood (one is picked per file from its first row):

* ``standard``: ``prompt``, ``chosen``, ``rejected`` strings (preference).
* ``implicit``: ``chosen`` and ``rejected`` strings holding prompt and response together;
  the prompt is their longest common prefix cut back to a whitespace boundary (it may be
  empty), the responses are the rest.
* ``conversational``: ``prompt`` a list of ``{"role", "content"}`` messages, ``chosen`` and
  ``rejected`` lists of (assistant) messages; ``implicit-conversational``: ``chosen`` and
  ``rejected`` full conversations whose shared leading messages are the prompt.
* ``prompt-completion``: ``prompt`` and ``completion`` (strings or message lists):
  demonstration records (``prompt`` + ``chosen``) for SFT.
* ``messages``: one conversation per row, its final assistant message the target:
  demonstration records.
* ``prompt-only``: ``prompt`` alone (a string or messages), TRL's format for online methods
  (GRPO, RLOO): prompt records for ``ppo`` and ``bon``, typically with the columns a reward
  function checks responses against (``--reward py:...``).
* ``text``: ``text`` alone, TRL's plain language-modelling format: text records, which only
  ``sft`` reads, with the loss on every token.

A row's other columns (``answer``, ``id``, ...) travel with its record, unchanged, under
``columns``: TRL hands them to reward functions as keyword arguments, and so does marlhf.

Conversations become text in the HH-RLHF transcript style the rest of the toolkit uses
(``"\\n\\nHuman: ...\\n\\nAssistant:"``; user/human -> Human, assistant -> Assistant, system
-> System), so the prompt ends with ``"\\n\\nAssistant:"`` and a response starts with a space.
"""

from __future__ import annotations

from .records import (
    INVALID,
    WRONG_TYPE,
    Parsed,
    RowProblem,
    check_text,
    get_field,
    get_text,
    preference,
    type_name,
)

NAME = "trl"
DESCRIPTION = "a local file in TRL's conventions (prompt/chosen/rejected, chosen/rejected, prompt/completion, messages, prompt, text)"
HUB = None
SAMPLE = None

ROLE_LABELS = {"user": "Human", "human": "Human", "assistant": "Assistant", "gpt": "Assistant", "system": "System"}


def detect(row: dict) -> str | None:
    """The row shape (see module doc), or ``None`` when no TRL convention fits."""
    keys = row.keys()
    if {"chosen", "rejected"} <= keys:
        conversational = isinstance(row["chosen"], list)
        if "prompt" in keys:
            return "conversational" if conversational or isinstance(row["prompt"], list) else "standard"
        return "implicit-conversational" if conversational else "implicit"
    if {"prompt", "completion"} <= keys:
        return "prompt-completion"
    if "messages" in keys:
        return "messages"
    if "prompt" in keys:
        return "prompt-only"
    if "text" in keys:
        return "text"
    return None


# the fields of each row shape that become the record; any other column is kept in ``columns``
RECORD_FIELDS = {
    "standard": ("prompt", "chosen", "rejected"),
    "implicit": ("chosen", "rejected"),
    "conversational": ("prompt", "chosen", "rejected"),
    "implicit-conversational": ("chosen", "rejected"),
    "prompt-completion": ("prompt", "completion"),
    "messages": ("messages",),
    "prompt-only": ("prompt",),
    "text": ("text",),
}


def parse(row: dict, variant: str) -> Parsed:
    """One source row -> record (with the row's other columns); raises RowProblem."""
    parsed = _parse(row, variant)
    columns = {key: value for key, value in row.items() if key not in RECORD_FIELDS[variant]}
    if columns:
        parsed.record["columns"] = columns
    return parsed


def _parse(row: dict, variant: str) -> Parsed:
    if variant == "standard":
        prompt = get_text(row, "prompt")
        return Parsed(preference(prompt, get_text(row, "chosen"), get_text(row, "rejected")), prompt)
    if variant == "implicit":
        prompt, chosen, rejected = split_common_prefix(get_text(row, "chosen"), get_text(row, "rejected"))
        return Parsed(preference(prompt, chosen, rejected, allow_empty_prompt=True), prompt)
    if variant == "conversational":
        prompt = render_prompt(_messages(row, "prompt"))
        chosen, rejected = render_response(_messages(row, "chosen")), render_response(_messages(row, "rejected"))
        return Parsed(preference(prompt, chosen, rejected), prompt)
    if variant == "implicit-conversational":
        chosen_turns, rejected_turns = _messages(row, "chosen"), _messages(row, "rejected")
        shared = 0
        while shared < min(len(chosen_turns), len(rejected_turns)) and chosen_turns[shared] == rejected_turns[shared]:
            shared += 1
        if shared == len(chosen_turns) or shared == len(rejected_turns):
            raise RowProblem(INVALID, "rejected", "chosen and rejected conversations do not diverge")
        prompt = render_prompt(chosen_turns[:shared])
        record = preference(prompt, render_response(chosen_turns[shared:]), render_response(rejected_turns[shared:]))
        return Parsed(record, prompt)
    if variant == "prompt-completion":
        return _demonstration(row, "prompt", "completion")
    if variant == "prompt-only":
        prompt = _prompt(row, "prompt")
        return Parsed({"prompt": prompt}, prompt)
    if variant == "text":
        text = get_text(row, "text")
        return Parsed({"text": text}, text)
    turns = _messages(row, "messages")
    if turns[-1]["role"] not in ("assistant", "gpt") or len(turns) < 2:
        raise RowProblem(INVALID, "messages", "expected a conversation ending with an assistant message")
    prompt = render_prompt(turns[:-1])
    return Parsed({"prompt": prompt, "chosen": render_response(turns[-1:])}, prompt)


def _prompt(row: dict, name: str) -> str:
    """A prompt given as text, or as messages rendered into a transcript."""
    value = get_field(row, name)
    return render_prompt(_messages(row, name)) if isinstance(value, list) else get_text(row, name)


def _demonstration(row: dict, prompt_field: str, target_field: str) -> Parsed:
    prompt = _prompt(row, prompt_field)
    target = get_field(row, target_field)
    chosen = render_response(_messages(row, target_field)) if isinstance(target, list) else get_text(row, target_field)
    return Parsed({"prompt": prompt, "chosen": chosen}, prompt)


def split_common_prefix(chosen: str, rejected: str) -> tuple[str, str, str]:
    """``(prompt, chosen_response, rejected_response)`` for TRL's implicit-prompt rows."""
    length = 0
    for a, b in zip(chosen, rejected, strict=False):
        if a != b:
            break
        length += 1
    cut = length
    while cut > 0 and not chosen[cut - 1].isspace():
        cut -= 1
    cut = max(cut - 1, 0)  # keep the whitespace with the responses, as TRL does
    return chosen[:cut], chosen[cut:], rejected[cut:]


def render_prompt(messages: list[dict]) -> str:
    """A conversation as an HH-style transcript ending with ``"\\n\\nAssistant:"``."""
    return "".join(_turn(m) for m in messages) + "\n\nAssistant:"


def render_response(messages: list[dict]) -> str:
    """The assistant's reply (and any later turns) as it follows a rendered prompt."""
    first, rest = messages[0], messages[1:]
    return " " + first["content"].strip() + "".join(_turn(m) for m in rest)


def _turn(message: dict) -> str:
    return f"\n\n{ROLE_LABELS[message['role']]}: {message['content'].strip()}"


def _messages(row: dict, name: str) -> list[dict]:
    """A non-empty list of ``{"role", "content"}`` messages with known roles and text."""
    value = get_field(row, name)
    if not isinstance(value, list):
        raise RowProblem(WRONG_TYPE, name, f"expected a list of messages, got {type_name(value)}")
    if not value:
        raise RowProblem(INVALID, name, "empty list of messages")
    for index, message in enumerate(value):
        label = f"{name}[{index}]"
        if not isinstance(message, dict):
            raise RowProblem(WRONG_TYPE, label, f"expected a message object, got {type_name(message)}")
        role = get_text(message, "role", parent=label)
        if role not in ROLE_LABELS:
            known = ", ".join(ROLE_LABELS)
            raise RowProblem(INVALID, f"{label}.role", f"unknown role '{role}' (expected one of {known})")
        check_text(get_field(message, "content", parent=label), f"{label}.content")
    return value
