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
Rows with message lists also keep their turns, under ``conversation`` (``prompt``, ``chosen``,
``rejected`` message lists, roles named user/assistant/system, contents as given), so that
:mod:`marlhf_cli.chat` can apply a chat template when a stage encodes them; a ``messages``
row's record also says ``all_assistant_turns`` (SFT trains every assistant turn of it under a
template, as TRL's ``assistant_only_loss`` does). String rows (``standard``, ``implicit``) are
plain text, as TRL's trainers treat them.
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
ROLES = {"user": "user", "human": "user", "assistant": "assistant", "gpt": "assistant", "system": "system"}


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
        turns = {"prompt": _messages(row, "prompt"), "chosen": _messages(row, "chosen"), "rejected": _messages(row, "rejected")}
        return _conversation_record(turns)
    if variant == "implicit-conversational":
        chosen_turns, rejected_turns = _messages(row, "chosen"), _messages(row, "rejected")
        shared = 0
        while shared < min(len(chosen_turns), len(rejected_turns)) and chosen_turns[shared] == rejected_turns[shared]:
            shared += 1
        if shared == len(chosen_turns) or shared == len(rejected_turns):
            raise RowProblem(INVALID, "rejected", "chosen and rejected conversations do not diverge")
        turns = {"prompt": chosen_turns[:shared], "chosen": chosen_turns[shared:], "rejected": rejected_turns[shared:]}
        return _conversation_record(turns)
    if variant == "prompt-completion":
        return _demonstration(row, "prompt", "completion")
    if variant == "prompt-only":  # GRPO's format: a conversation's turns kept for the template
        if isinstance(get_field(row, "prompt"), list):
            turns = _messages(row, "prompt")
            return _with_turns({"prompt": render_prompt(turns)}, {"prompt": turns})
        prompt = get_text(row, "prompt")
        return Parsed({"prompt": prompt}, prompt)
    if variant == "text":
        text = get_text(row, "text")
        return Parsed({"text": text}, text)
    turns = _messages(row, "messages")
    if turns[-1]["role"] not in ("assistant", "gpt") or len(turns) < 2:
        raise RowProblem(INVALID, "messages", "expected a conversation ending with an assistant message")
    return _conversation_record({"prompt": turns[:-1], "chosen": turns[-1:]}, all_assistant_turns=True)


def _conversation_record(turns: dict[str, list[dict]], **flags: bool) -> Parsed:
    """A record from message lists: the transcript strings, and the turns themselves."""
    prompt = render_prompt(turns["prompt"])
    responses = {key: render_response(value) for key, value in turns.items() if key != "prompt"}
    if "rejected" in responses:
        record = preference(prompt, responses["chosen"], responses["rejected"])
    else:
        record = {"prompt": prompt, "chosen": responses["chosen"]}
    return _with_turns(record, turns, **flags)


def _with_turns(record: dict, turns: dict[str, list[dict]], **flags: bool) -> Parsed:
    record["conversation"] = {key: [_plain_message(m) for m in value] for key, value in turns.items()} | flags
    return Parsed(record, record["prompt"])


def _plain_message(message: dict) -> dict:
    """A message as chat templates expect it: role user, assistant or system, its content as given."""
    return {"role": ROLES[message["role"]], "content": message["content"]}


def _demonstration(row: dict, prompt_field: str, target_field: str) -> Parsed:
    value, target = get_field(row, prompt_field), get_field(row, target_field)
    if not isinstance(value, list) and not isinstance(target, list):
        prompt = get_text(row, prompt_field)
        return Parsed({"prompt": prompt, "chosen": get_text(row, target_field)}, prompt)
    # a string beside a message list: as text, itself; as a turn, one user or assistant message
    if isinstance(value, list):
        prompt_turns = _messages(row, prompt_field)
        prompt = render_prompt(prompt_turns)
    else:
        prompt = get_text(row, prompt_field)
        prompt_turns = [{"role": "user", "content": prompt}]
    if isinstance(target, list):
        target_turns = _messages(row, target_field)
        chosen = render_response(target_turns)
    else:
        chosen = get_text(row, target_field)
        target_turns = [{"role": "assistant", "content": chosen}]
    return _with_turns({"prompt": prompt, "chosen": chosen}, {"prompt": prompt_turns, "chosen": target_turns})


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
