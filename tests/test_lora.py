"""LoRA through peft (marlhf_cli/lora.py): the reference and the reward model are the bases
with the adapter off, exactly; only adapters and heads train; merged exports reload with the
Auto classes and compute what the adapter model computes; sft -> rm -> ppo with LoRA end to
end; resume after SIGKILL; option errors in one line."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

import pytest

from _toy_prefs import write_toy_preferences
from marlhf_cli import config as config_module
from marlhf_cli import lora
from marlhf_cli.generation.texts import tokenize_prompts

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SMALL = dict(
    policy="tiny", reward_model="tiny", dataset="tldr", rollout_batch_size=4, mini_batch_size=2,
    max_new_tokens=8, max_prompt_length=48, max_steps=1, eval_prompts=0, save_every=0,
    actor_lr=5e-2, critic_lr=5e-2, lora_rank=4,
)  # fmt: skip


@pytest.fixture(scope="module")
def toy_preferences(tmp_path_factory) -> Path:
    return write_toy_preferences(tmp_path_factory.mktemp("toy") / "prefs.jsonl", n=120)


def _invoke(*args: str):
    from typer.testing import CliRunner

    from marlhf_cli.cli import app

    return CliRunner().invoke(app, list(args))


# ---------------------------------------------------------------------------------------
# options


def test_trainable_layers_0_with_lora_is_one_line_before_torch_loads(tmp_path, toy_preferences):
    import os
    import sys

    code = (
        "import atexit, sys\n"
        "atexit.register(lambda: print('torch loaded:', 'torch' in sys.modules, file=sys.stderr))\n"
        "from marlhf_cli.cli import main\n"
        f"sys.argv = ['marlhf', 'rm', '--model', 'tiny', '--dataset', {str(toy_preferences)!r}, '--run-dir', {str(tmp_path)!r},"
        " '--lora-rank', '4', '--trainable-layers', '0']\n"
        "main()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: --trainable-layers 0 with --lora-rank") and lines[1] == "torch loaded: False"


def test_bad_lora_values_and_ppo_dropout_are_refused(tmp_path):
    for args, words in (
        (["sft", "--lora-rank", "-1"], "--lora-rank must be 0 or more"),
        (["sft", "--lora-dropout", "1"], "--lora-dropout must be in [0, 1)"),
        (["rm", "--lora-targets", " , "], "--lora-targets must be all-linear or comma-separated"),
        (["ppo", "--lora-dropout", "0.1"], "No such option"),  # PPO runs without dropout
    ):
        result = _invoke(*args, "--run-dir", str(tmp_path))
        assert result.exit_code == 2 and words in result.output, (args, result.output)


@pytest.mark.slow
def test_unknown_target_module_is_one_line(tmp_path, toy_preferences):
    result = _invoke("sft", "--model", "tiny", "--dataset", str(toy_preferences), "--run-dir", str(tmp_path),
                     "--lora-rank", "4", "--lora-targets", "no_such_proj", "--max-steps", "1", "--batch-size", "2")  # fmt: skip
    assert result.exit_code == 2 and "--lora-targets no_such_proj" in result.output
    assert "Traceback" not in result.output


def test_an_adapters_base_is_written_so_peft_finds_it_from_any_folder(tmp_path, monkeypatch):
    """A relative --run-dir wrote 'runs/lora/sft' as the base, and the alias 'tiny' was written
    as it is: neither loads from another working folder."""
    (tmp_path / "runs" / "sft").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert lora.loadable_base("runs/sft") == str(tmp_path.resolve() / "runs" / "sft")
    assert lora.loadable_base("HuggingFaceTB/SmolLM2-135M") == "HuggingFaceTB/SmolLM2-135M"  # a hub id stays
    monkeypatch.setenv("MARLHF_CACHE", str(tmp_path / "cache"))
    tiny = Path(lora.loadable_base("tiny"))
    assert tiny.is_absolute() and (tiny / "config.json").is_file() and tiny.is_relative_to(tmp_path / "cache")
    assert lora.loadable_base("tiny") == str(tiny)  # saved once


def test_target_names():
    assert lora.target_names("all-linear") == lora.target_names(" ALL-LINEAR ") == "all-linear"
    assert lora.target_names("q_proj, v_proj,") == ["q_proj", "v_proj"]
    with pytest.raises(ValueError):
        lora.target_names(",")


def test_base_identity_changes_when_the_base_is_rewritten(tmp_path):
    """A LoRA checkpoint holds no frozen base: resuming onto a rewritten one must be refused."""
    import os

    config = config_module.resolve("ppo", flags={"lora_rank": 4})
    assert lora.base_identity(config_module.resolve("ppo"), policy="tiny") == {}
    assert lora.base_identity(config, policy="tiny") == {"lora_base_policy": "tiny"}
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"x" * 10)
    first = lora.base_identity(config, policy=str(tmp_path))
    os.utime(weights, ns=(1, 1))
    assert lora.base_identity(config, policy=str(tmp_path)) != first


# ---------------------------------------------------------------------------------------
# PPO: the reference and the reward are the bases, exactly; only adapters and heads train


def _trained_names(model) -> set[str]:
    return {name for name, p in model.named_parameters() if p.requires_grad}


@pytest.mark.slow
def test_ppo_reference_and_reward_are_the_bases_and_only_adapters_train(tmp_path):
    import torch

    from marlhf_cli import engine as eng
    from marlhf_cli.models import load_causal_lm, load_reward_model
    from marlhf_cli.train import ppo
    from marlhf_cli.train.forward import critic_values, policy_forward, resident
    from marlhf_cli.scoring.rewards import RewardModelReward, ScoringBatch

    config = config_module.resolve("ppo", flags={**SMALL, "run_dir": str(tmp_path)})
    eng.init_distributed()
    models = ppo.build_models(config, ppo.plan_run(config), "tiny", "tiny", None)
    assert isinstance(models.reference, lora.WithoutAdapter)  # no second copy of the policy
    assert isinstance(models.reward, ppo.models.BaseModelReward)  # ... nor of the reward model
    assert models.reward.model.module is models.critic.module.model
    for frozen in (models.reference, models.reward.model):  # --offload-frozen: nothing of theirs to move
        with resident(frozen, torch.device("meta"), offload=True):
            pass
    assert {p.device.type for e in (models.actor, models.critic) for p in e.module.parameters()} == {"cpu"}
    base_policy, base_rm = load_causal_lm("tiny").eval(), load_reward_model("tiny").eval()
    base_rm.config.pad_token_id = models.tokenizer.pad_token_id
    plain_reward = RewardModelReward(base_rm)

    prompts = tokenize_prompts(models.tokenizer, ["Tell me about cats.", "Rain?"], 16, "cpu")
    response = torch.randint(100, 5000, (2, 6), generator=torch.Generator().manual_seed(0))
    sequences = torch.cat([prompts[0], response], dim=1)
    mask = torch.cat([prompts[1], torch.ones_like(response)], dim=1)
    plen = prompts[0].shape[1]
    batch = ScoringBatch(["a", "b"], ["", ""], sequences, mask, plen, response, torch.ones_like(response), torch.ones(2, dtype=torch.bool))

    def logp(model):
        with torch.no_grad():
            return policy_forward(model, sequences, mask, plen, config.temperature)[0]

    def values():
        with torch.no_grad():
            return critic_values(models.critic, sequences, mask, plen)

    # B = 0: the adapted models compute exactly what their bases do
    base_logp, base_scores = logp(base_policy), plain_reward(batch)
    assert torch.equal(logp(models.actor), base_logp)
    assert torch.equal(logp(models.reference), base_logp)
    assert torch.equal(models.reward(batch), base_scores)
    values_before = values()

    def snapshot(module):
        return {name: p.detach().clone() for name, p in module.named_parameters()}

    actor_before, critic_before = snapshot(models.actor.module), snapshot(models.critic.module)
    trained_actor = _trained_names(models.actor.module)
    trained_critic = _trained_names(models.critic.module)
    assert trained_actor and all(".lora_A." in n or ".lora_B." in n for n in trained_actor)
    assert all(".lora_" in n or "score.modules_to_save." in n for n in trained_critic)
    assert any("score.modules_to_save." in n for n in trained_critic)  # the critic's head trains whole

    records = [{"prompt": f"prompt number {i}"} for i in range(8)]
    ctx = ppo.make_context(config, ppo.plan_run(config), models, records)
    ppo.ppo_step(ctx, 0)

    # the actor and the critic moved; the reference and the reward did not
    assert not torch.equal(logp(models.actor), base_logp)
    assert torch.equal(logp(models.reference), base_logp)
    assert not torch.equal(values(), values_before)
    assert torch.equal(models.reward(batch), base_scores)
    for module, before, trained in (
        (models.actor.module, actor_before, trained_actor), (models.critic.module, critic_before, trained_critic)
    ):  # fmt: skip
        changed = {n for n, p in module.named_parameters() if not torch.equal(p, before[n])}
        assert changed and changed <= trained, changed - trained  # the frozen base is untouched
        assert any(".lora_B." in n for n in changed)


# ---------------------------------------------------------------------------------------
# sft -> rm -> ppo with LoRA, the exports reloaded with the Auto classes


def _max_difference(a, b) -> float:
    return float((a - b).abs().max())


def _probe(tokenizer):
    import torch

    ids = tokenizer(["Question 3: tell me about rain.\nAnswer: Rain is good", "tell me about boats"], padding=True, return_tensors="pt")
    return ids["input_ids"], ids["attention_mask"].to(torch.long)


def _causal_logp(model, ids, mask):
    import torch

    from marlhf_cli.train.forward import policy_forward

    with torch.no_grad():
        return policy_forward(model.eval(), ids, mask, 2, 1.0)[0]


def _scores(model, ids, mask):
    import torch

    from marlhf_cli.scoring import heads as scoring

    with torch.no_grad():
        return scoring.sequence_scores(model.eval(), ids, mask)


@pytest.fixture(scope="module")
def lora_pipeline(tmp_path_factory, toy_preferences) -> Path:
    run_dir = tmp_path_factory.mktemp("lora-run")
    common = ["--dataset", str(toy_preferences), "--run-dir", str(run_dir), "--max-prompt-length", "32",
              "--max-response-length", "16", "--save-every", "0", "--eval-records", "10", "--lora-rank", "8"]  # fmt: skip
    sft = _invoke("sft", "--model", "tiny", *common, "--batch-size", "4", "--max-steps", "6", "--lr", "2e-2", "--eval-every", "0")
    assert sft.exit_code == 0, sft.output
    reward = _invoke("rm", *common, "--batch-size", "4", "--max-steps", "6", "--lr", "2e-2", "--eval-every", "0",
                     "--trainable-layers", "1")  # fmt: skip
    assert reward.exit_code == 0, reward.output
    ppo = _invoke("ppo", "--dataset", str(toy_preferences), "--run-dir", str(run_dir), "--lora-rank", "8",
                  "--rollout-batch-size", "4", "--mini-batch-size", "2", "--max-new-tokens", "8", "--max-prompt-length", "32",
                  "--max-steps", "2", "--eval-every", "0", "--eval-prompts", "2", "--save-every", "0",
                  "--actor-lr", "2e-2", "--critic-lr", "2e-2", "--name", "lora")  # fmt: skip
    assert ppo.exit_code == 0, ppo.output
    return run_dir


@pytest.mark.slow
def test_sft_export_is_merged_and_computes_what_the_adapter_model_computes(lora_pipeline):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from marlhf_cli.models import load_causal_lm, load_tokenizer

    folder = lora_pipeline / "sft"
    merged = AutoModelForCausalLM.from_pretrained(folder)
    assert not any("lora" in name for name, _ in merged.named_parameters())
    adapted = PeftModel.from_pretrained(load_causal_lm("tiny"), folder / lora.ADAPTER_DIR)
    ids, mask = _probe(load_tokenizer(str(folder)))
    got, want, base = _causal_logp(merged, ids, mask), _causal_logp(adapted, ids, mask), _causal_logp(load_causal_lm("tiny"), ids, mask)
    assert _max_difference(got, want) <= 1e-5
    assert _max_difference(got, base) > 1e-3  # the adapter learned something: the check has teeth
    settings = json.loads((folder / lora.ADAPTER_DIR / "adapter_config.json").read_text())
    assert settings["r"] == 8 and settings["lora_alpha"] == 16
    # the base PEFT loads is a real folder, by its absolute path (the random-init 'tiny' saved once
    # under marlhf's cache), so the adapter loads alone from any working folder
    base = Path(settings["base_model_name_or_path"])
    assert base.is_absolute() and (base / "config.json").is_file()
    card = (folder / lora.ADAPTER_DIR / "README.md").read_text()
    assert f"base_model: {base}" in card and "rank 8, alpha 16" in card and "trained by: `marlhf sft`" in card
    assert "command: `" in card and "--lora-rank 8" in card
    per_block = {name.rsplit(".", 1)[-1] for name in settings["target_modules"]}
    assert per_block == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}  # not lm_head


@pytest.mark.slow
def test_rm_export_merges_adapters_of_the_top_block_and_the_trained_head(lora_pipeline):
    import math

    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForSequenceClassification

    from marlhf_cli.models import load_reward_model, load_tokenizer

    folder = lora_pipeline / "rm"
    merged = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=1)
    assert math.isfinite(merged.config.marlhf_reward_mean) and merged.config.marlhf_reward_std > 0
    adapted = PeftModel.from_pretrained(load_reward_model(str(lora_pipeline / "sft")), folder / lora.ADAPTER_DIR)
    ids, mask = _probe(load_tokenizer(str(folder)))
    assert _max_difference(_scores(merged, ids, mask), _scores(adapted, ids, mask)) <= 1e-5
    saved = load_file(str(folder / lora.ADAPTER_DIR / "adapter_model.safetensors"))
    adapters = [k for k in saved if "lora_" in k]
    assert adapters and all(".layers.1." in k for k in adapters)  # --trainable-layers 1: the top block only
    assert any("score" in k for k in saved)  # the score head is saved whole


@pytest.mark.slow
def test_ppo_exports_actor_and_critic_merged(lora_pipeline):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from marlhf_cli.models import load_causal_lm, load_reward_model, load_tokenizer

    folder = lora_pipeline / "ppo" / "lora"
    ids, mask = _probe(load_tokenizer(str(folder)))
    actor = AutoModelForCausalLM.from_pretrained(folder)
    adapted = PeftModel.from_pretrained(load_causal_lm(str(lora_pipeline / "sft")), folder / lora.ADAPTER_DIR)
    assert _max_difference(_causal_logp(actor, ids, mask), _causal_logp(adapted, ids, mask)) <= 1e-5
    critic = AutoModelForSequenceClassification.from_pretrained(folder / "critic", num_labels=1)
    adapted_critic = PeftModel.from_pretrained(load_reward_model(str(lora_pipeline / "rm")), folder / "critic" / lora.ADAPTER_DIR)
    assert _max_difference(_scores(critic, ids, mask), _scores(adapted_critic, ids, mask)) <= 1e-5
    entry = json.loads((lora_pipeline / "run.json").read_text())["stages"]["ppo/lora"]
    assert entry["status"] == "finished" and entry["config"]["lora_rank"] == 8
    # the adapters name their bases by absolute path and load without marlhf, from anywhere
    from peft import AutoPeftModelForCausalLM, AutoPeftModelForSequenceClassification

    for where, auto, role in ((folder, AutoPeftModelForCausalLM, "actor"), (folder / "critic", AutoPeftModelForSequenceClassification, "critic")):
        settings = json.loads((where / lora.ADAPTER_DIR / "adapter_config.json").read_text())
        assert Path(settings["base_model_name_or_path"]).is_absolute()
        assert f"trained by: `marlhf ppo/lora {role}`" in (where / lora.ADAPTER_DIR / "README.md").read_text()
    with _in_folder(folder.parent.parent.parent):  # another working folder than the run's
        alone = AutoPeftModelForCausalLM.from_pretrained(str((folder / lora.ADAPTER_DIR).resolve()))
    assert _max_difference(_causal_logp(alone, ids, mask), _causal_logp(actor, ids, mask)) <= 1e-5


@contextlib.contextmanager
def _in_folder(folder):
    previous = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


# ---------------------------------------------------------------------------------------
# resume


@pytest.mark.slow
def test_sigkill_then_resume_with_lora_reproduces_the_uninterrupted_run(tmp_path):
    import torch

    from test_ppo_resume import NAME, command, environment, kill_once_saved, metrics, run_here

    from marlhf_cli.artifacts import read_jsonl

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    lora_flags = ("--lora-rank", "4", "--max-steps", "6")
    run_here(command(straight, *lora_flags))

    proc = subprocess.Popen(
        command(killed, *lora_flags), env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    kill_once_saved(proc, killed / "ppo" / NAME / "checkpoints" / "critic" / "latest")
    # the checkpoint leaves the frozen base out (a tied LM head's weight is all DeepSpeed keeps of it)
    saved = next((killed / "ppo" / NAME / "checkpoints" / "actor").glob("step-*/mp_rank_00_model_states.pt"))
    module = torch.load(saved, weights_only=False)["module"]
    assert [k for k in module if ".lora_" not in k] == ["base_model.model.lm_head.weight"]

    resumed = subprocess.run(command(killed, *lora_flags, "--resume"), env=environment(), capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming at step" in resumed.stderr
    assert metrics(killed) == metrics(straight)
    assert read_jsonl(killed / "samples" / f"{NAME}.jsonl") == read_jsonl(straight / "samples" / f"{NAME}.jsonl")


@pytest.mark.slow
def test_zero3_over_two_processes_trains_and_exports_the_adapters(tmp_path):
    """ZeRO-3 shards the frozen base too: the reference and the reward model (adapter off),
    the sampling copy (an adapted model refreshed from the shards) and the merged export
    must all still work."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from test_ppo_resume import NAME, command, environment

    from marlhf_cli.models import load_causal_lm, load_tokenizer

    result = subprocess.run(
        command(tmp_path, "--lora-rank", "4", "--nproc", "2", "--zero-stage", "3", "--max-steps", "2", "--save-every", "1",
                "--eval-every", "2"),
        env=environment(), capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "2 processes" in result.stderr
    folder = tmp_path / "ppo" / NAME
    ids, mask = _probe(load_tokenizer(str(folder)))
    merged = _causal_logp(AutoModelForCausalLM.from_pretrained(folder), ids, mask)
    adapted = PeftModel.from_pretrained(load_causal_lm("tiny"), folder / lora.ADAPTER_DIR)
    assert _max_difference(merged, _causal_logp(adapted, ids, mask)) <= 1e-5
    assert _max_difference(merged, _causal_logp(load_causal_lm("tiny"), ids, mask)) > 1e-4  # it trained


@pytest.mark.slow
def test_a_chat_model_with_lora_on_a_conversational_file_end_to_end(tmp_path):
    """What a practitioner runs (issue #25): SmolLM2-135M-Instruct's real weights and chat
    template, a conversational preference file, sft -> rm -> ppo each with --lora-rank 8. The
    instruct model already ends its turns with <|im_end|>: sampling stops there and the
    reward is read there; every export is merged weights with the adapter beside it."""
    pytest.importorskip("gguf")
    from marlhf_cli.artifacts import read_jsonl
    from transformers import AutoModelForCausalLM

    colours = {"sky": "Blue", "grass": "Green", "snow": "White", "coal": "Black", "blood": "Red", "a banana": "Yellow"}
    rows = [
        {"prompt": [{"role": "user", "content": f"Answer in one word: what colour is {thing}?" + " Thanks!" * i}],
         "chosen": [{"role": "assistant", "content": f"{colour}."}],
         "rejected": [{"role": "assistant", "content": f"I am not sure what colour {thing} is, sorry."}]}
        for i in range(6) for thing, colour in colours.items()
    ]  # fmt: skip
    data = tmp_path / "colours.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    run = tmp_path / "run"
    common = ["--dataset", str(data), "--run-dir", str(run), "--lora-rank", "8", "--save-every", "0", "--dtype", "fp32",
              "--max-prompt-length", "96"]  # fmt: skip
    for stage in (
        ["sft", "--model", "smollm2-135m", "--max-steps", "2", "--batch-size", "4", "--eval-records", "0",
         "--max-response-length", "16"],
        ["rm", "--max-steps", "2", "--batch-size", "4", "--eval-records", "0", "--max-response-length", "16"],
        ["ppo", "--max-steps", "1", "--rollout-batch-size", "4", "--mini-batch-size", "4", "--max-new-tokens", "24",
         "--eval-prompts", "4", "--eval-every", "0", "--temperature", "0.7"],
    ):  # fmt: skip
        result = _invoke(*stage, *common)
        assert result.exit_code == 0, result.output
    stages = json.loads((run / "run.json").read_text())["stages"]
    for stage in ("sft", "rm", "ppo/fixed5"):
        assert stages[stage]["status"] == "finished"
        assert stages[stage]["inputs"]["chat_template"]["end"] == "<|im_end|>"
        assert stages[stage]["inputs"]["chat_template"]["prompt"].endswith("<|im_start|>assistant\n")
    for folder in ("sft", "rm", "ppo/fixed5", "ppo/fixed5/critic"):
        assert (run / folder / "adapter" / "adapter_config.json").is_file(), folder
    AutoModelForCausalLM.from_pretrained(run / "ppo" / "fixed5")  # merged weights, no peft needed
    samples = read_jsonl(run / "samples" / "fixed5.jsonl")
    assert samples and all(s["response"].strip() for s in samples)
    # the instruct model ends its turns itself, on <|im_end|>, the template's stop token (a
    # 135M model may also ramble past 24 tokens: one stop is what the test can rely on)
    assert any(s["eos"] for s in samples), samples
