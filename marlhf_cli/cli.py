"""The ``marlhf`` command line: one thin function per command, wiring flags to a stage.

Each command resolves (and so checks) its options before it imports its stage, so a bad
value fails in one line before torch, a model or a dataset is loaded.
"""

from __future__ import annotations

from typing import Annotated, Any, Optional

import typer

from . import __version__, options
from .accepts import X_AXES, flag_name, one_of
from .errors import UserError
from .help_panels import GroupedHelp
from .evaluate import flags as eval_flags
from .rewards import flags as passk_flags
from .train import flags

app = typer.Typer(
    name="marlhf",
    help=(
        "MA-RLHF from the command line: supervised fine-tuning, reward models, PPO and MA-PPO "
        "(RLHF with macro actions), DPO, and previews of macro-action segmentation. "
        "All stages share one run directory (--run-dir)."
    ),
    no_args_is_help=True,
    add_completion=False,
    cls=options.OneLineErrors,
    # click's plain help wraps long flag names instead of cutting them (rich's table cuts
    # them below ~120 columns); it is readable at 80 columns.
    rich_markup_mode=None,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"marlhf {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """MA-RLHF: RLHF with macro actions."""


@app.command(cls=GroupedHelp)
@options.user_errors
@options.with_flags(options.COMMON)
def segment(
    file: Annotated[
        str,
        typer.Argument(
            help="Plain text (one response), or JSONL with a 'response' or 'text' field per line; '-' reads stdin.",
            show_default=False,
        ),
    ],
    rule: Annotated[
        Optional[str],
        typer.Option(
            "--rule",
            help="Termination rule: fixed, randomized, ppl, parsing, code; several comma-separated, or 'all' (those five); or turn: a conversation (a JSONL file of messages, or a Human:/Assistant: transcript), each assistant turn one macro action. [default: fixed]",
            show_default=False,
        ),
    ] = None,
    n: Annotated[
        Optional[str],
        typer.Option("--n", help="Segment length of the fixed rule, and the fallback of the text rules; 'inf' = whole response. [default: 5]", show_default=False),
    ] = None,
    cutoff: Annotated[
        Optional[int],
        typer.Option("--cutoff", help="Largest segment, in tokens, of the parsing rule (C) and the code rule (C_code). [default: 5 for parsing, 10 for code]", show_default=False),
    ] = None,
    tokenizer: Annotated[
        Optional[str],
        typer.Option("--tokenizer", help="Tokenizer: hub id, local path, or alias 'tiny'/'smollm2-135m' (SmolLM2's, offline). [default: tiny]", show_default=False),
    ] = None,
    model: Annotated[
        Optional[str],
        typer.Option("--model", help="Reference model for the ppl rule (must share the tokenizer's vocabulary). [default: smollm2-135m]", show_default=False),
    ] = None,
    backend: Annotated[
        Optional[str],
        typer.Option("--backend", help="Parser of the parsing rule: auto (stanza if its English model is installed, else spaCy), stanza, spacy. [default: auto]", show_default=False),
    ] = None,
    output_format: Annotated[
        Optional[str],
        typer.Option("--format", help="text: segments joined with @@ (coloured on a terminal); json: one JSON object per response and rule. [default: text]", show_default=False),
    ] = None,
    stats: Annotated[
        bool, typer.Option("--stats", help="Print segment-length statistics per rule instead of the segments: count, mean, largest, share longer than --cutoff, histogram.")
    ] = False,
    **shared: Any,
) -> None:
    """Preview the macro actions a termination rule makes of text.

    Shows the segments (macro actions) of each response, or their length statistics.

    Examples: marlhf segment answer.txt --rule parsing;
    marlhf segment samples.jsonl --rule all --stats; echo 'x = 1' | marlhf segment - --rule code
    """
    config = options.resolve_config(
        "segment",
        rule=rule, n=n, cutoff=cutoff, tokenizer=tokenizer, model=model, backend=backend,
        format=output_format, stats=stats or None, **shared,
    )
    from . import segment as preview
    preview.run(config, file)


@app.command(cls=GroupedHelp)
@options.user_errors
@options.with_flags(flags.DATA, flags.TRAINING, flags.ENGINE, flags.LORA_TRAINING, flags.TRACKING, options.RUN_DIR, options.COMMON)
def sft(
    model: Annotated[Optional[str], typer.Option("--model", help="Base causal LM: hub id, local folder, or alias 'tiny'/'smollm2-135m' (offline). [default: google/gemma-2b]", show_default=False)] = None,
    packing: flags.PackingOption = None,
    **shared: Any,
) -> None:
    """Supervised fine-tuning of the policy; writes sft/.

    Trains on prompt + chosen response, with the loss on the response tokens only.

    Examples: marlhf sft --preset cpu-tiny; marlhf sft --dataset hh --data-file hh.jsonl --model smollm2-135m;
    marlhf sft --resume (after a crash); marlhf sft --nproc 2 --zero-stage 3
    """
    config = options.resolve_config("sft", model=model, packing=packing, **shared)
    from .train import sft as stage
    stage.run(config)


@app.command(cls=GroupedHelp)
@options.user_errors
@options.with_flags(flags.DATA, flags.TRAINING, flags.ENGINE, flags.LORA_TRAINING, flags.TRACKING, options.RUN_DIR, options.COMMON)
def rm(
    model: Annotated[Optional[str], typer.Option("--model", help="Base model for the reward model (hub id, folder, alias). [default: the run's sft/ folder]", show_default=False)] = None,
    trainable_layers: flags.TrainableLayersOption = None,
    **shared: Any,
) -> None:
    """Train a pairwise reward model from sft/; writes rm/.

    Loss -log sigmoid(r_chosen - r_rejected), starting from the SFT model.

    Reports held-out accuracy, margin and score mean/std (stored in rm/config.json).
    Examples: marlhf rm --preset cpu-tiny; marlhf rm --dataset hh --data-file hh.jsonl --model smollm2-135m
    """
    config = options.resolve_config("rm", model=model, trainable_layers=trainable_layers, **shared)
    from .train import rm as stage
    stage.run(config)


@app.command(cls=GroupedHelp)
@options.user_errors
@options.with_flags(flags.PPO, flags.DATA, flags.ENGINE, flags.LORA, flags.TRACKING, options.ALLOW_NEW_HEAD, options.RUN_DIR, options.COMMON)
def ppo(names: flags.Names = None, compare: flags.Compare = False, x_axis: flags.XAxis = None, **shared: Any) -> None:
    """PPO and MA-PPO (RLHF with macro actions); writes ppo/<name>/.

    Policy and reference from sft/, critic and reward from rm/ (or the reward from your
    Python function: --reward py:FILE.py:FUNCTION).

    Examples: marlhf ppo --termination ppl (MA-PPO); marlhf ppo --termination fixed --n 1 (vanilla PPO);
    marlhf ppo --preset cpu-tiny; marlhf ppo --resume; marlhf ppo --compare vanilla fixed5 ppl;
    marlhf ppo --advantage grpo --dataset prompts.jsonl --reward py:my_rewards.py:accuracy;
    marlhf ppo --advantage mc --termination fixed --n 8 (Monte-Carlo segment advantages, no critic)
    """
    dry_run = shared.pop("dry_run") and not compare  # --compare draws finished runs: nothing to print
    if shared["reward"]:  # --reward repeated and/or comma-separated: one list
        shared["reward"] = ",".join(shared["reward"])
    config = options.resolve_config("ppo", dry_run=dry_run, **shared)
    if x_axis is not None:
        one_of(*X_AXES).check("--x-axis", x_axis)
    if compare or names:
        from .train.ppo import report

        report.compare_command(config.run_dir, names or [], compare, x_axis)
        return
    if x_axis is not None:
        raise UserError("--x-axis goes with --compare (the axis of its eval curves)")
    from .train import ppo as stage  # its option checks need torch, and come before "run marlhf sft first"

    given = [flag_name(field) for field in flags.ESTIMATOR_FIELDS if shared[field] is not None]
    stage.run(config, given_flags=given)


@app.command(cls=GroupedHelp)
@options.user_errors
@options.with_flags(flags.DPO, flags.DATA, flags.TRAINING, flags.ENGINE, flags.LORA_TRAINING, flags.TRACKING, options.ALLOW_NEW_HEAD, options.RUN_DIR,
                    options.COMMON)  # fmt: skip
def dpo(**shared: Any) -> None:
    """DPO of the policy from sft/ (the paper's baseline); writes dpo/.

    The paper's DPO baseline: policy and reference from the SFT model, the pairs of the PPO
    share, loss -log sigmoid(beta x margin) (or ipo, label smoothing, a length penalty).

    Reports TRL's rewards/ and logps/ metrics on the held-out pairs; bon, judge and passk take
    the result as --policy dpo. Examples: marlhf dpo --preset cpu-tiny; marlhf dpo --dataset hh
    --preset hh; marlhf dpo --loss-type ipo --beta 0.5; marlhf dpo --length-penalty 0.01
    """
    config = options.resolve_config("dpo", **shared)
    from .artifacts import RunDir
    from .train.sources import dpo_sources

    dpo_sources(config, RunDir(config.run_dir))  # "run marlhf sft first" before torch is imported
    from .train import dpo as stage

    stage.run(config)


@app.command(cls=GroupedHelp)
@options.user_errors
@options.with_flags(flags.EPISODES, options.ALLOW_NEW_HEAD, options.RUN_DIR, options.COMMON)
def bon(
    policy: eval_flags.BonPolicy = None,
    reward_model: eval_flags.BonRewardModel = None,
    reward: eval_flags.BonReward = None,
    n: eval_flags.BonN = None,
    temperature: eval_flags.BonTemperature = None,
    name: eval_flags.BonName = None,
    dataset: flags.DatasetOption = None,
    dataset_config: flags.DatasetConfigOption = None,
    dataset_split: flags.DatasetSplitOption = None,
    data_file: flags.DataFileOption = None,
    strict: flags.StrictOption = None,
    chat_template: flags.ChatTemplateOption = None,
    max_records: eval_flags.BonMaxRecords = None,
    top_k: eval_flags.BonTopK = None,
    top_p: eval_flags.BonTopP = None,
    max_prompt_length: eval_flags.BonMaxPrompt = None,
    max_new_tokens: eval_flags.BonMaxNew = None,
    batch_size: eval_flags.BonBatch = None,
    generation: flags.GenerationOption = None,
    normalize: eval_flags.BonNormalize = None,
    **shared: Any,
) -> None:
    """Best-of-N reward per temperature (the paper's Figure 8).

    Mean reward-model score of the best of N samples per prompt, for each temperature.

    Samples the largest N once per temperature and estimates smaller N from the same samples;
    writes bon/<name>.json, bon/<name>-best.jsonl, plots/bon-<name>.png; a rerun skips finished temperatures.
    Several policies, comma-separated, each get their own sweep on the same prompts and one table
    side by side (with --n 1, the paper's Table 7). With --env, each sample is an episode with your
    environment and its score the episode's return. Examples: marlhf bon --policy ppo/fixed5 --n 4,8,16
    --temperature 0.2,0.6,1.0; marlhf bon --policy sft,dpo,ppo/rloo,ppo/vanilla,ppo/fixed5 --n 1 --temperature 0.8
    """
    config = options.resolve_config(
        "bon",
        name=name, policy=policy, reward_model=reward_model, reward=reward, n=n, temperature=temperature, dataset=dataset,
        dataset_config=dataset_config, dataset_split=dataset_split, data_file=data_file, strict=strict, chat_template=chat_template, max_records=max_records, top_k=top_k, top_p=top_p,
        max_prompt_length=max_prompt_length, max_new_tokens=max_new_tokens, batch_size=batch_size,
        generation=generation, normalize=normalize, **shared,
    )
    from .evaluate import bon as stage

    stage.run_policies(config) if "," in (config.policy or "") else stage.run(config)


@app.command(cls=GroupedHelp)
@options.user_errors
@options.with_flags(options.ALLOW_NEW_HEAD, options.RUN_DIR, options.COMMON)
def judge(
    file_a: Annotated[str, typer.Argument(help="Samples of the first policy (JSONL rows with prompt and response); verdicts are stated for it.", show_default=False)],
    file_b: Annotated[str, typer.Argument(help="Samples of the second policy, matched to the first by prompt.", show_default=False)],
    gpt4: eval_flags.Gpt4 = None,
    judge_model: eval_flags.JudgeModel = None,
    base_url: eval_flags.BaseUrl = None,
    api_key_env: eval_flags.ApiKeyEnv = None,
    task: eval_flags.Task = None,
    template: eval_flags.Template = None,
    both_orders: eval_flags.BothOrders = None,
    sample: eval_flags.Sample = None,
    concurrency: eval_flags.Concurrency = None,
    timeout: eval_flags.Timeout = None,
    max_retries: eval_flags.MaxRetries = None,
    retry_wait: eval_flags.RetryWait = None,
    max_tokens: eval_flags.MaxTokens = None,
    rm_judge: eval_flags.RmJudge = None,
    reward_model: eval_flags.JudgeRewardModel = None,
    max_prompt_length: eval_flags.JudgeMaxPrompt = None,
    max_response_length: eval_flags.JudgeMaxResponse = None,
    batch_size: eval_flags.JudgeBatch = None,
    chat_template: eval_flags.JudgeChatTemplate = None,
    strict: flags.StrictOption = None,
    name: eval_flags.JudgeName = None,
    **shared: Any,
) -> None:
    """Win/tie/loss of two sample files by a judge, with 95% CIs.

    Pairwise judging as in the paper's Figure 4 and Table 1; verdicts are for the first file.

    The API key comes from $OPENAI_API_KEY (or --api-key-env). Writes judge/<name>.json, plots/judge-<name>.png
    and plots/judge.png (every comparison of the run directory);
    every reply is cached in judge/cache/, so a rerun never pays twice. Exit code 1 when judgements still failed.
    Examples: marlhf judge --gpt4 --sample 50 samples/fixed5.jsonl samples/vanilla.jsonl;
    marlhf judge --model my-model --base-url http://localhost:8000/v1 --both-orders A.jsonl B.jsonl; marlhf judge --rm A.jsonl B.jsonl
    """
    config = options.resolve_config(
        "judge",
        name=name, gpt4=gpt4, judge_model=judge_model, base_url=base_url, api_key_env=api_key_env, task=task,
        template=template, both_orders=both_orders, sample=sample, concurrency=concurrency, timeout=timeout,
        max_retries=max_retries, retry_wait=retry_wait, max_tokens=max_tokens, rm_judge=rm_judge,
        reward_model=reward_model, max_prompt_length=max_prompt_length, max_response_length=max_response_length,
        batch_size=batch_size, chat_template=chat_template, strict=strict, **shared,
    )
    from .evaluate import judge as stage
    outcome = stage.run(config, file_a, file_b)
    if outcome["failed"]:
        raise typer.Exit(code=1)


@app.command(cls=GroupedHelp)
@options.user_errors
@options.with_flags(flags.EPISODES, options.RUN_DIR, options.COMMON)
def passk(
    model: passk_flags.Model = None,
    name: passk_flags.Name = None,
    dataset: passk_flags.Dataset = None,
    data_file: passk_flags.DataFile = None,
    strict: flags.StrictOption = None,
    reward: passk_flags.Reward = None,
    chat_template: passk_flags.ChatTemplate = None,
    split: passk_flags.Split = None,
    limit: passk_flags.Limit = None,
    n: passk_flags.N = None,
    k: passk_flags.K = None,
    temperature: passk_flags.Temperature = None,
    top_k: passk_flags.TopK = None,
    top_p: passk_flags.TopP = None,
    max_prompt_length: passk_flags.MaxPrompt = None,
    max_new_tokens: passk_flags.MaxNew = None,
    batch_size: passk_flags.BatchSize = None,
    generation: flags.GenerationOption = None,
    time_limit: passk_flags.TimeLimit = None,
    memory_mb: passk_flags.MemoryMb = None,
    workers: passk_flags.Workers = None,
    max_tests: passk_flags.MaxTests = None,
    dtype: passk_flags.Dtype = None,
    **shared: Any,
) -> None:
    """pass@k per difficulty of sandboxed programs (Table 3).

    Samples n programs per problem and runs them against the problem's tests in a sandbox.

    With --env, each sample is an episode with your environment (pass@k with feedback turns), passing
    at a return of 1 or more. Writes passk/<name>.json and passk/<name>-samples.jsonl. Examples:
    marlhf passk --model ppo/fixed10 --n 5 --k 1,5;
    marlhf passk --model tiny --data-file problems.jsonl --n 2 --k 1,2 --max-new-tokens 64
    """
    config = options.resolve_config(
        "passk",
        model=model, name=name, dataset=dataset, data_file=data_file, strict=strict, reward=reward,
        chat_template=chat_template, split=split, limit=limit,
        n=n, k=k, temperature=temperature, top_k=top_k, top_p=top_p, max_prompt_length=max_prompt_length,
        max_new_tokens=max_new_tokens, batch_size=batch_size, generation=generation, time_limit=time_limit, memory_mb=memory_mb,
        workers=workers, max_tests=max_tests, dtype=dtype, **shared,
    )
    from .rewards import passk as stage
    stage.run(config)


@app.command(cls=GroupedHelp)
@options.user_errors
def push(
    folder: Annotated[str, typer.Argument(help="A stage's export in a run directory: RUN_DIR/sft, RUN_DIR/rm, RUN_DIR/dpo or RUN_DIR/ppo/NAME.", show_default=False)],
    repo: Annotated[str, typer.Argument(help="The Hub repository, owner/name (made if it does not exist).", show_default=False)],
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the model card and the files an upload would send; send nothing.")] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show the full traceback of an error.")] = False,
) -> None:
    """Upload a stage's export to the Hub, with a model card.

    The card comes from run.json (base model, stage, rule, estimator, dataset, steps, final
    figures, the command); resume checkpoints stay behind. Needs the network and a token
    (HF_TOKEN or huggingface-cli login). Examples: marlhf push runs/default/ppo/fixed5 me/tldr-ma-ppo;
    marlhf push runs/default/sft me/tldr-sft --dry-run
    """
    from pathlib import Path

    from . import hub_push
    from .errors import UserError

    try:
        hub_push.check_repo_id(repo)
    except ValueError:
        raise UserError(f"marlhf push: '{repo}' is not a Hub repository id (owner/name)") from None
    if dry_run:
        files, card = hub_push.plan(Path(folder), repo)
        print(card)
        print(f"# {len(files)} files to upload to {repo}: " + ", ".join(files))
        return
    from .train.common import say

    hub_push.push(Path(folder), repo, say, after_stage=False)


def main() -> None:
    from .launch import relaunched_argv

    argv = relaunched_argv()  # a process of a --nproc relaunch: its arguments come from the environment
    app(args=argv) if argv is not None else app()


if __name__ == "__main__":
    main()
