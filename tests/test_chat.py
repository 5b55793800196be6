"""``--chat-template``: SmolLM2's template on every TRL row shape, the tokens SFT trains, where
sampling stops and the reward model reads, ``none`` and plain-text data unchanged, template
files good and bad, ``--dry-run``, and sft -> rm -> ppo end to end on a conversational file.

Expected texts are written out from SmolLM2-Instruct's documented ChatML format (a default
system turn, then ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message, and
``<|im_start|>assistant\\n`` as the generation prompt); expected ids are literal or come from
tokenizing those texts whole, never from the code under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from marlhf_cli.chat import ChatFormat
from marlhf_cli.cli import app
from marlhf_cli.data import load_records
from marlhf_cli.errors import UserError
from marlhf_cli.train import rm, sft
from marlhf_cli.encode import IGNORE

pytestmark = pytest.mark.usefixtures("one_torch_thread")

IM_END = 2  # SmolLM2's <|im_end|>: its end of turn, EOS and pad at once
ENDOFTEXT = 0  # <|endoftext|>: a special token a template file may end turns with
SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
PROMPT_TEXT = SYSTEM + "<|im_start|>user\nCapital of France?<|im_end|>\n<|im_start|>assistant\n"
# PROMPT_TEXT tokenized (special tokens 1 = <|im_start|>, 2 = <|im_end|>; 198 = "\n")
PROMPT_IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712,
              8182, 2, 198, 1, 4093, 198, 39832, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]  # fmt: skip
PARIS, LONDON = [38634, 30], [21253, 30]  # "Paris.", "London."
TRANSCRIPT_IDS = [198, 198, 14917, 42, 14937, 282, 4649, 47, 198, 198, 9519, 9531, 42]  # "\n\nHuman: Capital of France?\n\nAssistant:"
SPACE_PARIS = [7042, 30]  # " Paris."

USER = {"role": "user", "content": "Capital of France?"}
GOOD, BAD = {"role": "assistant", "content": "Paris."}, {"role": "assistant", "content": "London."}
ROWS = {
    "conversational": {"prompt": [USER], "chosen": [GOOD], "rejected": [BAD]},
    "implicit-conversational": {"chosen": [USER, GOOD], "rejected": [USER, BAD]},
    "prompt-completion": {"prompt": [USER], "completion": [GOOD]},
    "messages": {"messages": [USER, GOOD]},
}
# a template file ending turns with <|endoftext|> instead of SmolLM2's <|im_end|>
OWN_END = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|endoftext|>' + '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def one_record(tmp_path: Path, row: dict) -> dict:
    result = load_records(str(write_jsonl(tmp_path / "rows.jsonl", [row])))
    assert len(result.records) == 1
    return result.records[0]


def template_file(tmp_path: Path, text: str, name: str = "chat.jinja") -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def labelled(example: dict) -> list[int]:
    """The ids SFT trains on, in order."""
    return [label for label in example["labels"] if label != IGNORE]


# ---------------------------------------------------------------------------------------
# rendering every TRL row shape


@pytest.mark.parametrize("shape", sorted(ROWS))
def test_smollm2_template_on_every_conversational_row_shape(tokenizer, tmp_path, shape):
    record = one_record(tmp_path, ROWS[shape])
    chat = ChatFormat(tokenizer, "auto")
    rendered = chat.render(record, "chosen")
    assert rendered.prompt == PROMPT_TEXT == chat.prompt(record)
    assert (rendered.response, rendered.end_id) == ("Paris.", IM_END)
    example = sft.encode_rendered(tokenizer, rendered, 512, 512)
    assert example["input_ids"] == PROMPT_IDS + PARIS + [IM_END]
    # the same ids as the whole conversation tokenized at once (up to the end of turn)
    whole = PROMPT_TEXT + "Paris.<|im_end|>"
    assert example["input_ids"] == tokenizer(whole, add_special_tokens=False)["input_ids"]
    assert example["labels"] == [IGNORE] * len(PROMPT_IDS) + PARIS + [IM_END]
    if "rejected" in record:
        pair = rm.encode_pair(tokenizer, record, 512, 512, chat)
        assert pair == {"chosen": PROMPT_IDS + PARIS + [IM_END], "rejected": PROMPT_IDS + LONDON + [IM_END],
                        "prompt_length": len(PROMPT_IDS)}


def test_messages_row_trains_every_assistant_turn_and_only_them(tokenizer, tmp_path):
    turns = [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4."}, {"role": "user", "content": "And 3+3?"},
        {"role": "assistant", "content": "6."},
    ]  # fmt: skip
    record = one_record(tmp_path, {"messages": turns})
    rendered = ChatFormat(tokenizer, "auto").render(record, "chosen")
    # a system message of its own replaces the default one
    before = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    between = "\n<|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"
    assert rendered.pieces == ((before, False), ("4.<|im_end|>", True), (between, False))
    assert (rendered.response, rendered.end_id) == ("6.", IM_END)
    example = sft.encode_rendered(tokenizer, rendered, 512, 512)
    ids = tokenizer(before + "4.<|im_end|>" + between + "6.<|im_end|>", add_special_tokens=False)["input_ids"]
    assert example["input_ids"] == ids
    four, six = tokenizer("4.", add_special_tokens=False)["input_ids"], tokenizer("6.", add_special_tokens=False)["input_ids"]
    n_before, n_between = (len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in (before, between))
    expected = [IGNORE] * n_before + four + [IM_END] + [IGNORE] * n_between + six + [IM_END]
    assert example["labels"] == expected  # the "\n" after each <|im_end|> is not trained
    # PPO and the reward model see the whole conversation as the prompt
    assert ChatFormat(tokenizer, "auto").prompt(record) == before + "4.<|im_end|>" + between


def test_a_cut_response_loses_its_end_of_turn_and_a_long_prompt_keeps_its_end(tokenizer, tmp_path):
    rendered = ChatFormat(tokenizer, "auto").render(one_record(tmp_path, ROWS["conversational"]), "chosen")
    assert sft.encode_rendered(tokenizer, rendered, 512, 3)["input_ids"][-3:] == PARIS + [IM_END]
    cut = sft.encode_rendered(tokenizer, rendered, 10, 2)
    assert cut["input_ids"] == PROMPT_IDS[-10:] + PARIS  # no end of turn: it would teach stopping mid-answer
    assert labelled(cut) == PARIS


# ---------------------------------------------------------------------------------------
# what stays as it was


def test_none_reproduces_the_transcript_encoding(tokenizer, tmp_path):
    record = one_record(tmp_path, ROWS["conversational"])
    none = ChatFormat(tokenizer, "none")
    assert none.prompt(record) == "\n\nHuman: Capital of France?\n\nAssistant:"
    example = sft.encode_rendered(tokenizer, none.render(record, "chosen"), 512, 512)
    assert example["input_ids"] == TRANSCRIPT_IDS + SPACE_PARIS + [IM_END]
    assert example == sft.encode_example(tokenizer, record["prompt"], record["chosen"], 512, 512)
    assert rm.encode_pair(tokenizer, record, 512, 512, none) == rm.encode_pair(tokenizer, record, 512, 512)
    assert none.stop_ids == (IM_END,)


def test_string_rows_and_paper_datasets_keep_their_text_under_auto(tokenizer, tmp_path):
    """TRL's standard and implicit string rows are plain text (as in TRL's trainers), like the
    paper's datasets: auto encodes them exactly as before templates (cpu-tiny's TL;DR included)."""
    auto = ChatFormat(tokenizer, "auto")
    standard = one_record(tmp_path, {"prompt": "Q: capital of France?\nA:", "chosen": " Paris.", "rejected": " Rome."})
    implicit = one_record(tmp_path, {"chosen": "Capital of France? Paris.", "rejected": "Capital of France? Rome."})
    strings = one_record(tmp_path, {"prompt": "Q: capital of France?\nA:", "completion": " Paris."})
    for record in (standard, implicit, strings):
        assert "conversation" not in record and not auto.applies(record)
        example = sft.encode_rendered(tokenizer, auto.render(record, "chosen"), 512, 512)
        assert example == sft.encode_example(tokenizer, record["prompt"], record["chosen"], 512, 512)
    assert auto.render(standard, "chosen").prompt == "Q: capital of France?\nA:"
    for name in ("tldr", "hh"):
        records = load_records(name, split="sft").records  # offline: the embedded samples
        for record in records:
            rendered = auto.render(record, "chosen")
            assert rendered.pieces == ((record["prompt"], False),) and rendered.response == record["chosen"]
            assert rendered.end_id == tokenizer.eos_token_id and auto.prompt(record) == record["prompt"]


def test_a_template_file_applies_to_plain_text_records_too(tokenizer, tmp_path):
    """Naming a template is how plain text is told to use one: the prompt as one user turn."""
    path = template_file(tmp_path, tokenizer.chat_template)  # SmolLM2's own template, as a file
    standard = one_record(tmp_path, {"prompt": "Capital of France? ", "chosen": " Paris.", "rejected": " London."})
    chat = ChatFormat(tokenizer, path)
    assert chat.applies(standard)
    rendered = chat.render(standard, "rejected")
    assert (rendered.prompt, rendered.response, rendered.end_id) == (PROMPT_TEXT, "London.", IM_END)
    assert rm.encode_pair(tokenizer, standard, 512, 512, chat)["chosen"] == PROMPT_IDS + PARIS + [IM_END]


def test_auto_without_a_tokenizer_template_keeps_the_transcript(tokenizer, tmp_path):
    import copy

    bare = copy.deepcopy(tokenizer)
    bare.chat_template = None
    record = one_record(tmp_path, ROWS["conversational"])
    auto = ChatFormat(bare, "auto")
    assert not auto.applies(record) and "no chat template" in auto.describe()
    assert sft.encode_rendered(bare, auto.render(record, "chosen"), 512, 512)["input_ids"] == TRANSCRIPT_IDS + SPACE_PARIS + [IM_END]


def test_conversations_sharing_no_prompt_get_an_empty_user_turn(tokenizer, tmp_path):
    """Templates cannot render an empty conversation: TRL rows whose two sides share no
    leading message are answered after an empty user turn."""
    record = one_record(tmp_path, {"chosen": [GOOD], "rejected": [BAD]})
    rendered = ChatFormat(tokenizer, "auto").render(record, "rejected")
    assert rendered.prompt == SYSTEM + "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n"
    assert rendered.response == "London."


# ---------------------------------------------------------------------------------------
# template files, good and bad


def test_a_template_file_with_its_own_end_of_turn_token(tokenizer, tmp_path):
    chat = ChatFormat(tokenizer, template_file(tmp_path, OWN_END))
    assert (chat.end_id, chat.stop_ids) == (ENDOFTEXT, (IM_END, ENDOFTEXT))
    record = one_record(tmp_path, ROWS["conversational"])
    rendered = chat.render(record, "chosen")
    assert rendered.prompt == "<|im_start|>user\nCapital of France?<|endoftext|>\n<|im_start|>assistant\n"
    assert (rendered.response, rendered.end_id) == ("Paris.", ENDOFTEXT)
    assert labelled(sft.encode_rendered(tokenizer, rendered, 512, 512)) == PARIS + [ENDOFTEXT]
    assert rm.encode_pair(tokenizer, record, 512, 512, chat)["rejected"][-3:] == LONDON + [ENDOFTEXT]


def test_a_template_whose_turns_end_with_no_special_token_ends_responses_with_eos(tokenizer, tmp_path):
    plain = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n\\n' }}{% endfor %}{% if add_generation_prompt %}{{ 'assistant: ' }}{% endif %}"
    chat = ChatFormat(tokenizer, template_file(tmp_path, plain))
    rendered = chat.render(one_record(tmp_path, ROWS["conversational"]), "chosen")
    assert (rendered.prompt, rendered.response, rendered.end_id) == ("user: Capital of France?\n\nassistant: ", "Paris.", IM_END)
    assert chat.stop_ids == (IM_END,)


BAD_TEMPLATES = {
    "missing": (None, "no file"),
    "empty": ("  \n", "is empty"),
    "syntax": ("{% for m in messages %}{{ m['content'] }", "line 1: not a valid Jinja template"),
    "raises": ("{{ raise_exception('only system messages, please') }}", "cannot render a conversation: only system messages, please"),
    "no reply": ("{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}{% endfor %}", "does not write an assistant reply"),
}


@pytest.mark.parametrize("case", sorted(BAD_TEMPLATES))
def test_a_bad_template_file_is_one_line_and_exit_2(tmp_path, case):
    pytest.importorskip("gguf")
    text, message = BAD_TEMPLATES[case]
    path = str(tmp_path / "absent.jinja") if text is None else template_file(tmp_path, text)
    data = write_jsonl(tmp_path / "chat.jsonl", [ROWS["conversational"]] * 4)
    args = ["sft", "--model", "tiny", "--dataset", str(data), "--run-dir", str(tmp_path / "run"), "--chat-template", path]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: --chat-template") and message in lines[0], result.output
    assert not (tmp_path / "run" / "sft").exists()


# ---------------------------------------------------------------------------------------
# where sampling stops and the reward is read


@pytest.fixture(scope="module")
def tiny_models():
    pytest.importorskip("gguf")
    from marlhf_cli.models import load_causal_lm, load_reward_model, load_tokenizer

    return load_tokenizer("tiny", padding_side="left"), load_causal_lm("tiny"), load_reward_model("tiny")


def test_sampling_stops_at_the_templates_end_of_turn_token(tiny_models, tmp_path):
    """A policy that always says <|endoftext|>: under a template ending turns with it, each
    response is that one token (mask [1, 0, ...]), the score goes there; without the
    template's stop id it would run to --max-new-tokens."""
    import copy

    import torch

    from marlhf_cli.train.ppo.experience import RolloutSettings, generate, place_rewards
    from marlhf_cli.generation import response_mask

    tokenizer, actor, _ = tiny_models
    actor = copy.deepcopy(actor)
    head = torch.nn.Linear(actor.config.hidden_size, actor.config.vocab_size, bias=True)
    with torch.no_grad():  # logits: 0 everywhere but 100 for <|endoftext|>, whatever the input
        head.weight.zero_()
        head.bias.zero_()
        head.bias[ENDOFTEXT] = 100.0
    actor.lm_head = head
    chat = ChatFormat(tokenizer, template_file(tmp_path, OWN_END))
    record = one_record(tmp_path, ROWS["conversational"])
    prompts = [chat.prompt(record)] * 2
    torch.manual_seed(0)
    settings = RolloutSettings(max_new_tokens=6, max_prompt_length=64, top_k=0, stop_token_ids=chat.stop_ids)
    _, _, ids, mask, ended, _ = generate(actor, tokenizer, prompts, settings, device="cpu")
    assert ids[:, 0].tolist() == [ENDOFTEXT, ENDOFTEXT] and ended.all()
    assert ids.shape[1] == 1 and mask.tolist() == [[1], [1]]  # stopped at once
    rewards = place_rewards(torch.zeros(mask.shape), torch.tensor([1.0, 2.0]), mask, 0.0)
    assert rewards.tolist() == [[1.0], [2.0]]
    torch.manual_seed(0)
    _, _, running, _, ended, _ = generate(actor, tokenizer, prompts, RolloutSettings(max_new_tokens=6, max_prompt_length=64, top_k=0), device="cpu")
    assert running.shape[1] == 6 and not ended.any()  # EOS alone does not stop it
    # several stop ids: the mask ends at the first of any of them
    rows = torch.tensor([[5, 6, ENDOFTEXT, IM_END, IM_END], [5, IM_END, 7, 8, 9], [5, 6, 7, 8, 9]])
    mask, ended = response_mask(rows, chat.stop_ids)
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]] and ended.tolist() == [True, True, False]


def test_the_reward_model_reads_its_score_on_the_end_of_turn_token(tiny_models, tmp_path):
    """pad == EOS == <|im_end|> for SmolLM2: the score is read on the last real token, the end of
    turn, exactly as a forward over the unpadded sequence puts it."""
    import torch

    from marlhf_cli.scoring.heads import sequence_scores, token_values

    tokenizer, _, reward_model = tiny_models
    record = one_record(tmp_path, ROWS["conversational"])
    pair = rm.encode_pair(tokenizer, record, 512, 512, ChatFormat(tokenizer, "auto"))
    assert pair["chosen"][-3:] == PARIS + [IM_END] and pair["rejected"][-3:] == LONDON + [IM_END]
    short = {"chosen": pair["chosen"][:20], "rejected": pair["rejected"][:20]}  # right padding after them
    batch = rm.collate([pair, short], tokenizer.pad_token_id)  # rows: chosen, short chosen, rejected, short rejected
    with torch.no_grad():
        scores = sequence_scores(reward_model, batch["input_ids"], batch["attention_mask"])
        for row, ids in enumerate([pair["chosen"], short["chosen"], pair["rejected"], short["rejected"]]):
            alone = torch.tensor([ids])
            at_last = token_values(reward_model, alone, torch.ones_like(alone))[0, -1]  # the <|im_end|> of a whole row
            assert float(scores[row]) == pytest.approx(float(at_last), abs=1e-5)


def test_judge_rm_renders_a_samples_conversation(tiny_models, tmp_path):
    """``judge --rm`` scores a sample that carries its conversation as ``marlhf rm`` trained on it."""
    from marlhf_cli.evaluate.pairs import Pair
    from marlhf_cli.evaluate.rm_judge import judge, score_texts

    tokenizer, _, reward_model = tiny_models
    pair = Pair("k", "\n\nHuman: Capital of France?\n\nAssistant:", "Paris.", "London.")
    rows, shown = judge([pair], "tiny", max_prompt=512, max_response=512, batch_size=2,
                        conversations={pair.prompt: {"prompt": [USER]}})  # fmt: skip
    assert (shown["prompt"], shown["response"], shown["end"]) == (PROMPT_TEXT, "Paris.", "<|im_end|>")
    expected = score_texts(reward_model, tokenizer, [PROMPT_TEXT, PROMPT_TEXT], ["Paris.", "London."], max_prompt=512, max_response=512, batch_size=2)
    assert [rows[0]["score_a"], rows[0]["score_b"]] == pytest.approx(expected, abs=1e-5)
    plain, shown = judge([pair], "tiny", max_prompt=512, max_response=512, batch_size=2, chat_template="none",
                         conversations={pair.prompt: {"prompt": [USER]}})  # fmt: skip
    assert shown["prompt"] == pair.prompt and plain[0]["score_a"] != pytest.approx(rows[0]["score_a"], abs=1e-6)


# ---------------------------------------------------------------------------------------
# the command line


def test_dry_run_shows_the_rendered_record(tmp_path):
    pytest.importorskip("gguf")
    data = write_jsonl(tmp_path / "chat.jsonl", [ROWS["conversational"]] * 4)
    result = CliRunner().invoke(app, ["sft", "--model", "tiny", "--dataset", str(data), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "chat_template: auto" in result.output
    assert f"# the first record of {data}" in result.output
    comments = result.output.split("# prompt:\n", 1)[1].splitlines()
    assert comments == [f"#   {line}".rstrip() for line in PROMPT_TEXT.split("\n")] + ["# response (then <|im_end|>):", "#   Paris."]
    # no sft/ yet for rm: it says why instead of failing the dry run
    later = CliRunner().invoke(app, ["rm", "--dataset", str(data), "--run-dir", str(tmp_path / "run"), "--dry-run"])
    assert later.exit_code == 0 and "# rendered record: not shown" in later.output and "marlhf sft" in later.output


def test_an_unreadable_template_is_a_user_error_in_the_library_too(tokenizer, tmp_path):
    with pytest.raises(UserError, match="no file"):
        ChatFormat(tokenizer, str(tmp_path / "nope.jinja"))


@pytest.mark.slow
def test_sft_rm_ppo_on_a_conversational_file(tmp_path):
    """The whole pipeline on tiny with --chat-template auto: every stage records the rendered
    record in run.json, and the policy's samples end on <|im_end|> (SFT taught it to stop)."""
    pytest.importorskip("gguf")
    from marlhf_cli.artifacts import read_jsonl
    from marlhf_cli.models import load_tokenizer

    names = ["Ana", "Ben", "Cleo", "Dan", "Eve", "Finn", "Gus", "Hana", "Ivo", "Jo", "Kim", "Lea"]
    names += [f"{a}{b}" for a in ("Al", "Bo", "Cy") for b in ("ma", "ro", "ti", "vu")]  # enough distinct eval prompts
    rows = [
        {"prompt": [{"role": "user", "content": f"Greet {n}, please."}], "chosen": [{"role": "assistant", "content": f"Hello {n}!"}],
         "rejected": [{"role": "assistant", "content": f"Go away {n}."}]}
        for n in names * 3
    ]  # fmt: skip
    data = str(write_jsonl(tmp_path / "chat.jsonl", rows))
    run = str(tmp_path / "run")
    common = ["--dataset", data, "--run-dir", run, "--max-prompt-length", "64", "--save-every", "0", "--chat-template", "auto"]
    steps = [
        ["sft", "--model", "tiny", "--max-steps", "40", "--batch-size", "8", "--lr", "2e-2", "--lr-scheduler", "linear",
         "--eval-records", "0", "--max-response-length", "16"],
        ["rm", "--max-steps", "2", "--batch-size", "4", "--lr", "1e-3", "--eval-records", "0", "--max-response-length", "16"],
        ["ppo", "--max-steps", "1", "--rollout-batch-size", "4", "--mini-batch-size", "4", "--max-new-tokens", "12",
         "--eval-prompts", "4", "--eval-every", "0", "--temperature", "0.7"],
    ]  # fmt: skip
    for args in steps:
        result = CliRunner().invoke(app, [*args, *common])
        assert result.exit_code == 0, result.output
    assert "responses end with <|im_end|> (id 2)" in result.output
    stages = json.loads((Path(run) / "run.json").read_text())["stages"]
    for stage in ("sft", "rm", "ppo/fixed5"):
        shown = stages[stage]["inputs"]["chat_template"]
        assert shown["template"] == "the tokenizer's" and shown["end"] == "<|im_end|>"
        assert shown["prompt"].startswith(SYSTEM + "<|im_start|>user\nGreet ") and shown["prompt"].endswith(", please.<|im_end|>\n<|im_start|>assistant\n")
        assert shown["response"].startswith("Hello ") and "<|im_" not in shown["response"]
    samples = read_jsonl(Path(run) / "samples" / "fixed5.jsonl")
    tokenizer = load_tokenizer("tiny")
    distinct = {r["prompt"] for r in load_records(data, split="eval").records}  # ppo evaluates each once
    assert len(samples) == min(4, len(distinct)) >= 2
    for sample in samples:
        assert sample["eos"] and sample["response"].startswith("Hello")  # it stopped, on its own
        # the response's tokens and then <|im_end|>: the last token counted is the end of turn
        assert sample["length"] == len(tokenizer(sample["response"], add_special_tokens=False)["input_ids"]) + 1
        assert sample["conversation"]["prompt"][0]["content"].startswith("Greet ")
        # what the policy saw, the template's rendering, beside the transcript a judge matches on
        assert sample["prompt"].lstrip().startswith("Human: Greet ")
        assert sample["rendered_prompt"].startswith(SYSTEM + "<|im_start|>user\nGreet ")
