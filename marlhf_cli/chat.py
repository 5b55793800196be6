"""Chat templates (``--chat-template``): the one place a record becomes the text a model reads.

Records keep the paper's strings (``prompt``, ``chosen``, ``rejected``; conversations as the
HH-style ``Human: ... Assistant:`` transcript) and, when they came from a conversation (a
TRL file's message lists, :mod:`marlhf_cli.data.trl`), the turns themselves under
``conversation``. :meth:`ChatFormat.render` turns a record and one response (its own
``chosen``/``rejected``, or a generated text) into a :class:`Rendered`: the prompt, ending
with the template's generation prompt, the response, and the token that ends the response.
SFT, RM, PPO, bon, passk and ``judge --rm`` all encode through it, so the policy learns to
end its turn with the token the sampler stops at and the reward model reads its score on.

``--chat-template`` values:

* ``auto`` (default): the tokenizer's own template on conversational records, when the
  tokenizer has one; plain-text records (tldr, the HH transcript, webgpt, apps, TRL's
  "standard" string rows, as TRL's trainers do) keep the paper's format.
* ``none``: the records' own strings everywhere (the transcript, as before templates).
* ``FILE``: that Jinja template on every record, plain-text ones too (its prompt as one user
  turn, its response as one assistant turn): naming a template is how a plain-text dataset
  is told to use one.

Under a template the response is the assistant turn up to its end-of-turn token (found by
rendering a probe reply: the first special token after it, e.g. SmolLM2's ``<|im_end|>``;
the ``\\n`` the template writes after it belongs to no one). The response text excludes it
and :attr:`Rendered.end_id` is its id, appended exactly as EOS is for plain text (and, like
EOS, dropped when the response is cut at ``--max-response-length``). A template whose turns
end with no special token ends responses with EOS. Spans come from rendering prefixes of the
conversation (the prompt alone with the generation prompt, then with the reply), so no
``{% generation %}`` markers are needed; a template that renders a conversation's start
differently once more turns follow is a one-line error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .errors import UserError

AUTO = "auto"
NONE = "none"
_PROBE = "MarlhfProbeReply"  # a reply no template rewrites (no whitespace to trim, no markup)


@dataclass(frozen=True)
class Rendered:
    """One record and response as text.

    ``pieces``: the prompt in order; a piece marked True is an earlier assistant turn
    (``messages`` rows under a template) that SFT trains, its end-of-turn token included.
    ``response`` is followed by the token ``end_id`` (the end of turn, or EOS).
    """

    pieces: tuple[tuple[str, bool], ...]
    response: str
    end_id: int

    @property
    def prompt(self) -> str:
        return "".join(text for text, _ in self.pieces)


def check_template_file(value: str) -> None:
    """``--chat-template FILE``: a readable, non-empty Jinja template, or a one-line error.

    Compiled with transformers' own template compiler (its tags included), the one that
    renders it later; should that private function move, the check is left to rendering,
    whose errors are one line too.
    """
    if value in (AUTO, NONE):
        return
    text = _read(value)
    import jinja2

    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template
    except ImportError:
        return

    try:
        _compile_jinja_template(text)
    except jinja2.TemplateSyntaxError as err:
        raise UserError(f"--chat-template: {value}, line {err.lineno}: not a valid Jinja template ({err.message})") from None


def _read(value: str) -> str:
    path = Path(value)
    if not path.is_file():
        raise UserError(f"--chat-template must be auto, none or a Jinja template file; no file '{value}'")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"--chat-template: cannot read {value} ({type(err).__name__})") from None
    if not text.strip():
        raise UserError(f"--chat-template: {value} is empty")
    return text


class ChatFormat:
    """How one tokenizer's records become text under a ``--chat-template`` value."""

    def __init__(self, tokenizer, value: str = AUTO):
        self.tokenizer = tokenizer
        self.value = value
        self.eos_id = tokenizer.eos_token_id
        if value == NONE:
            self.template, self.source = None, "none"
        elif value == AUTO:
            # get_chat_template: the default one of a tokenizer that names several
            self.template = tokenizer.get_chat_template() if getattr(tokenizer, "chat_template", None) else None
            self.source = "the tokenizer's" if self.template else "none (the tokenizer has no chat template)"
        else:
            self.template, self.source = _read(value), value
        self.plain_too = value not in (AUTO, NONE)  # a named file applies to every record
        self.end_text, self.end_id, self.suffix = "", self.eos_id, ""
        if self.template is not None:
            self._find_end_of_turn()

    # -- what applies -------------------------------------------------------------------

    @property
    def stop_ids(self) -> tuple[int, ...]:
        """Tokens that end a sampled response: EOS, and the end-of-turn token of a template."""
        return (self.eos_id,) if self.end_id == self.eos_id else (self.eos_id, self.end_id)

    def applies(self, record: dict) -> bool:
        """Whether ``record`` is rendered with the template (else: its own strings). A text
        record (TRL's language-modelling rows) has no turns: it is never templated."""
        if self.template is None or "prompt" not in record:
            return False
        return "conversation" in record or self.plain_too

    def note(self, records: Sequence[dict]) -> str | None:
        """:meth:`describe` when the template renders these records (their first), else None:
        plain-text data needs no word."""
        return self.describe() if records and self.applies(records[0]) else None

    def describe(self) -> str:
        """One line for the start-up message: which template, on what, ending turns how."""
        if self.template is None:
            return f"chat template: {self.source}"
        end = self.tokenizer.convert_ids_to_tokens(self.end_id)
        where = "on every record" if self.plain_too else "on conversational records (plain-text ones keep their format)"
        return f"chat template: {self.source}, {where}; responses end with {end} (id {self.end_id})"

    # -- rendering ----------------------------------------------------------------------

    def prompt(self, record: dict) -> str:
        """The prompt text: with the template, ending with its generation prompt."""
        if not self.applies(record):
            return record["prompt"]
        return self._strip_bos(self._apply(self._turns(record)["prompt"], generation=True))

    def render(self, record: dict, key: str = "chosen", *, text: str | None = None) -> Rendered:
        """The record's prompt and a response: ``record[key]`` (its turns under a template), or
        ``text`` (a generated reply) when given."""
        if not self.applies(record):
            return Rendered(((record["prompt"], False),), record[key] if text is None else text, self.eos_id)
        turns = self._turns(record)
        prompt_turns = turns["prompt"]
        reply = [{"role": "assistant", "content": text}] if text is not None else turns[key]
        prompt = self._apply(prompt_turns, generation=True)
        whole = self._apply(prompt_turns + list(reply))
        response = self._reply(whole, prompt)
        spans = self._assistant_spans(prompt_turns, prompt) if turns.get("all_assistant_turns") else []
        return Rendered(self._pieces(prompt, spans), response, self.end_id)

    def example(self, records: Sequence[dict]) -> dict[str, Any]:
        """What run.json and ``--dry-run`` show: the first record rendered (prompt, response and
        the token that ends it), beside the template's name."""
        shown: dict[str, Any] = {"template": self.source}
        if not records:
            return shown
        record = records[0]
        if "prompt" not in record:  # a text record: trained as it is
            return shown | {"text": record["text"]}
        key = next((k for k in ("chosen", "completion", "response") if isinstance(record.get(k), str)), None)
        if key is None:  # a problem record (apps): the prompt only
            return shown | {"prompt": self.prompt(record)}
        return self.shown(self.render(record, key))

    def shown(self, rendered: Rendered) -> dict[str, Any]:
        """A rendered record as run.json records it."""
        end = self.tokenizer.convert_ids_to_tokens(rendered.end_id)
        return {"template": self.source, "prompt": rendered.prompt, "response": rendered.response, "end": end}

    # -- episodes (--env): a conversation the policy and an environment write together ----

    def episode_prompt(self, message: str) -> str:
        """The text before an episode's first assistant turn: its first user message under the
        template, or the HH transcript's ``Human: ... Assistant:`` without one (``none``)."""
        if self.template is None:
            return f"\n\nHuman: {message}\n\nAssistant:"
        return self._strip_bos(self._apply([{"role": "user", "content": message}], generation=True))

    def observation_text(self, message: str, role: str = "user") -> str:
        """The text between an assistant turn's end token and the next turn's first token: what
        the template writes after a reply, the environment's message in its role, the
        generation prompt (found by rendering a probe reply with and without the message
        after it). Without a template, the transcript's next ``Human:`` (or ``Tool:``) turn."""
        if self.template is None:
            return f"\n\n{'Human' if role == 'user' else 'Tool'}: {message}\n\nAssistant:"
        probe = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": _PROBE}]
        before = self._apply(probe)
        after = self._apply(probe + [{"role": role, "content": message}], generation=True)
        cut = before.find(_PROBE) + len(_PROBE)
        if self.end_text and before.startswith(self.end_text, cut):
            cut += len(self.end_text)
        if cut < len(_PROBE) or after[:cut] != before[:cut]:
            raise UserError(f"--chat-template {self.source}: the template renders a reply differently once a {role} message "
                            "follows it, so an episode's turns cannot be told apart")  # fmt: skip
        return after[cut:]

    # -- internals ----------------------------------------------------------------------

    def _turns(self, record: dict) -> dict:
        """The record's conversation; a plain-text record as one user and one assistant turn.
        A template needs a message, so an empty prompt is one empty user turn."""
        turns = record.get("conversation")
        if turns is None:
            turns = {"prompt": [{"role": "user", "content": record["prompt"].strip()}]}
            for key in ("chosen", "rejected", "completion", "response"):
                if isinstance(record.get(key), str):
                    turns[key] = [{"role": "assistant", "content": record[key].strip()}]
        if not turns["prompt"]:
            turns = {**turns, "prompt": [{"role": "user", "content": ""}]}
        return turns

    def _apply(self, messages: Sequence[dict], generation: bool = False) -> str:
        import jinja2

        try:
            return self.tokenizer.apply_chat_template(
                list(messages), chat_template=self.template, tokenize=False, add_generation_prompt=generation
            )
        except (jinja2.TemplateError, TypeError, ValueError) as err:
            first = (str(err).splitlines() or [type(err).__name__])[0]
            raise UserError(f"--chat-template {self.source}: cannot render a conversation: {first}") from None

    def _find_end_of_turn(self) -> None:
        """The end-of-turn token: the first special token the template writes after a reply."""
        probe = [{"role": "user", "content": "Hi"}]
        before = self._apply(probe, generation=True)
        after = self._apply(probe + [{"role": "assistant", "content": _PROBE}])
        at = after.find(_PROBE, len(before)) if after.startswith(before) else -1
        if at < 0:
            raise UserError(
                f"--chat-template {self.source}: the template does not write an assistant reply after the "
                "generation prompt it ends prompts with, so responses cannot be told apart"
            )
        self.suffix = after[at + len(_PROBE) :]
        special = set(self.tokenizer.all_special_ids) | {
            i for i, token in self.tokenizer.added_tokens_decoder.items() if getattr(token, "special", False)
        }
        for token_id in self.tokenizer(self.suffix, add_special_tokens=False)["input_ids"]:
            if token_id in special:
                self.end_id = token_id
                self.end_text = self.tokenizer.convert_ids_to_tokens(token_id)
                return

    def _reply(self, whole: str, prompt: str) -> str:
        """The reply's text in ``whole``: after ``prompt``, up to its last end-of-turn token."""
        if not whole.startswith(prompt):
            raise UserError(
                f"--chat-template {self.source}: the template renders the prompt differently once the "
                "reply follows it, so the reply's tokens cannot be told apart"
            )
        tail = whole[len(prompt) :]
        if self.end_text:
            cut = tail.rfind(self.end_text)
            if cut < 0:
                raise UserError(f"--chat-template {self.source}: an assistant turn does not end with {self.end_text}")
            return tail[:cut]
        return tail[: len(tail) - len(self.suffix)] if self.suffix and tail.endswith(self.suffix) else tail

    def _assistant_spans(self, turns: Sequence[dict], prompt: str) -> list[tuple[int, int]]:
        """Character spans in ``prompt`` of its assistant turns, each with its end-of-turn token.

        A turn is found between the conversation before it (with the generation prompt) and
        the conversation up to it; an assistant turn that opens the conversation has no
        "before" to render and is not trained.
        """
        spans = []
        for index, turn in enumerate(turns):
            if turn["role"] != "assistant" or index == 0:
                continue
            before = self._apply(turns[:index], generation=True)
            upto = self._apply(turns[: index + 1])
            if not prompt.startswith(upto):
                raise UserError(
                    f"--chat-template {self.source}: the template renders earlier turns differently once "
                    "later ones follow, so the assistant turns cannot be told apart"
                )
            reply = self._reply(upto, before)
            spans.append((len(before), len(before) + len(reply) + len(self.end_text)))
        return spans

    def _pieces(self, prompt: str, spans: list[tuple[int, int]]) -> tuple[tuple[str, bool], ...]:
        pieces, at = [], 0
        for start, end in spans:
            pieces += [(prompt[at:start], False), (prompt[start:end], True)]
            at = end
        pieces.append((prompt[at:], False))
        pieces = [(text, trained) for text, trained in pieces if text]
        first, trained = pieces[0]
        return ((self._strip_bos(first), trained), *pieces[1:])

    def _strip_bos(self, text: str) -> str:
        """A template that writes the BOS itself: encoding adds it as a token (encode.special_prefix)."""
        from .encode import special_prefix

        bos = self.tokenizer.bos_token
        if bos and special_prefix(self.tokenizer) == (self.tokenizer.bos_token_id,) and text.startswith(bos):
            return text[len(bos) :]
        return text


# ---------------------------------------------------------------------------------------
# --dry-run


def preview(config: Any, stage: str) -> str:
    """YAML comment lines showing how the stage's first record will read (``--dry-run``).

    The tokenizer is the stage's model's; a named dataset is read from its embedded sample
    (the same format, and no download). When the tokenizer or the data cannot be had yet (no
    sft/ in the run directory, a model the cache lacks), one line says why.
    """
    try:
        tokenizer_name, records, where = _preview_inputs(config, stage)
        from .models import load_tokenizer

        chat = ChatFormat(load_tokenizer(tokenizer_name), config.chat_template)
        shown = chat.example(records)
    except UserError as err:
        return f"# rendered record: not shown ({err})\n"
    lines = [f"# {chat.describe()}", f"# the first record of {where}, as {tokenizer_name}'s tokenizer reads it:"]
    for label in ("prompt", "response"):
        if label in shown:
            after = f" (then {shown['end']})" if label == "response" else ""
            lines.append(f"# {label}{after}:")
            lines += [f"#   {line}".rstrip() for line in shown[label].split("\n")]
    return "\n".join(lines) + "\n"


def _preview_inputs(config: Any, stage: str) -> tuple[str, list[dict], str]:
    """(tokenizer, the first record, where it came from) for :func:`preview`."""
    from .artifacts import RunDir
    from .data import DATASETS, load_records

    run_dir = RunDir(config.run_dir)
    if stage == "sft":
        name = str(config.model)
    elif stage == "rm":
        name = str(config.model) if config.model else str(run_dir.require("sft"))
    elif stage in ("ppo", "dpo"):
        name = str(config.policy) if config.policy else str(run_dir.require("sft"))
    else:  # bon, passk: a run-directory stage or a model
        name = run_dir.policy(config.policy if stage == "bon" else config.model)[0]
    dataset, data_file = config.dataset, config.data_file
    if data_file is None and dataset.lower() in DATASETS:
        data_file = DATASETS[dataset.lower()].sample_path
    from .data.loader import hub_options

    result = load_records(dataset, data_file=data_file, limit=1, **hub_options(config))
    return name, result.records, result.source
