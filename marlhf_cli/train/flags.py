"""Command-line options of the training stages: sft and rm, the engine, and ``marlhf ppo``.

Every option defaults to None ("not given"), so the config's precedence holds: a flag wins
over ``--config`` and ``--preset``, which win over the stage's defaults. Defaults shown in
the help are the config dataclasses' (``marlhf_cli/config.py``). Importing this module
costs nothing beyond typer.
"""

from __future__ import annotations

from typing import Annotated, List, Optional

import typer


from ..options import opt as _opt, switch as _switch


# data ------------------------------------------------------------------------------------
DatasetOption = Annotated[
    Optional[str],
    _opt("--dataset", "tldr, hh, webgpt, apps (the paper's datasets), a Hugging Face Hub id (owner/name, e.g. trl-lib/ultrafeedback_binarized; --dataset-config, --dataset-split) or a local .jsonl/.json/.parquet file, in any of TRL's formats: preference (prompt/chosen/rejected, or chosen/rejected conversations), prompt-only, prompt/completion, conversational (messages) or language modelling (text). [default: tldr]"),
]
DatasetConfigOption = Annotated[
    Optional[str], _opt("--dataset-config", "With a hub id as --dataset: its configuration (load_dataset's name), where it has several."),
]
DatasetSplitOption = Annotated[
    Optional[str],
    _opt("--dataset-split", "With a hub id as --dataset: the split its records come from; 10% of it is held out for evaluation. [default: train]"),
]
DataFileOption = Annotated[
    Optional[str],
    _opt("--data-file", "A local file in --dataset's format (e.g. Anthropic's raw HH-RLHF jsonl) instead of the hub."),
]
StrictOption = Annotated[
    Optional[bool],
    typer.Option("--strict/--no-strict", help="Stop at the first bad row instead of skipping and counting it. [default: no-strict]", show_default=False),
]
MaxRecordsOption = Annotated[Optional[int], _opt("--max-records", "Use at most this many training records (quick runs).")]
ChatTemplateOption = Annotated[
    Optional[str],
    _opt("--chat-template", "How records become text: auto (the tokenizer's chat template on conversational data, i.e. a TRL file's message lists; plain-text datasets keep their format), none (the Human:/Assistant: transcript), or a Jinja template FILE (applied to every record, a plain prompt as one user turn). Responses end with the template's end-of-turn token, where sampling stops and the reward is read. [default: auto]"),
]
SplitSharesOption = Annotated[
    Optional[str],
    _opt("--split-shares", "How sft, rm and ppo share the source's records, as SFT/RM/PPO (e.g. 20/40/40); give every stage the same value, so their records never overlap. 10% is held out for evaluation first (unless the source has its own eval split), whatever the shares; a fourth number, SFT/RM/PPO/EVAL (e.g. 0/0/2/1), holds out that share of the source instead. [default: the paper's datasets 20/40/40, APPS 20/0/80; a file of your own in TRL's formats is not shared out: each stage takes all of it]"),
]
EvalRecordsOption = Annotated[
    Optional[int], _opt("--eval-records", "Held-out records used per evaluation (0 turns evaluation off). [default: 500]")
]

# schedule --------------------------------------------------------------------------------
LrOption = Annotated[Optional[float], _opt("--lr", "Peak learning rate (AdamW). [default: sft 2e-5, rm 1e-5, dpo 2e-7 (the paper's)]")]
BatchSizeOption = Annotated[
    Optional[int],
    _opt("--batch-size", "Global batch per optimizer step (sequences for sft, pairs for rm and dpo), over all processes and accumulation steps. [default: 64]"),
]
EpochsOption = Annotated[Optional[int], _opt("--epochs", "Passes over the training split (ignored when --max-steps is set). [default: 1]")]
MaxStepsOption = Annotated[Optional[int], _opt("--max-steps", "Stop after this many optimizer steps (cycling the data if needed).")]
MaxPromptOption = Annotated[
    Optional[int], _opt("--max-prompt-length", "Prompt tokens kept (the end of longer prompts). [default: 512]")
]
MaxResponseOption = Annotated[
    Optional[int], _opt("--max-response-length", "Response tokens kept (longer responses are cut and get no EOS). [default: 512]")
]
EvalEveryOption = Annotated[Optional[int], _opt("--eval-every", "Evaluate on held-out data every N steps (and at the end); 0 = only at the end. [default: 100]")]
SaveEveryOption = Annotated[Optional[int], _opt("--save-every", "Write a resume checkpoint every N steps; 0 = never. [default: 200]")]
ResumeOption = Annotated[
    Optional[bool],
    typer.Option("--resume/--no-resume", help="Continue from the stage's last checkpoint in the run directory (model, optimizer, schedule, data position, RNG); an error when there is none.", show_default=False),
]
PackingOption = Annotated[
    Optional[bool],
    typer.Option("--packing/--no-packing", help="Pack examples into blocks of max-prompt + max-response tokens (less padding). [default: no-packing]", show_default=False),
]

# engine ----------------------------------------------------------------------------------
ZeroStageOption = Annotated[Optional[int], _opt("--zero-stage", "DeepSpeed ZeRO stage 0, 1, 2 or 3. [default: 0]")]
DtypeOption = Annotated[Optional[str], _opt("--dtype", "Training precision: auto (bf16 where the hardware multiplies bf16 fast: CUDA compute capability >= 8, CPUs with amx_bf16 or avx512_bf16; fp32 elsewhere; the start-up line says which), fp32 or bf16 (bf16 compute, fp32 master weights and optimizer states). [default: auto]")]
GradAccumOption = Annotated[
    Optional[int], _opt("--gradient-accumulation-steps", "Micro-batches per optimizer step in each process. [default: 1]")
]
GradCkptOption = Annotated[
    Optional[bool],
    typer.Option("--gradient-checkpointing/--no-gradient-checkpointing", help="Recompute activations in the backward pass (less memory, slower). [default: off]", show_default=False),
]
OffloadOptimizerOption = Annotated[
    Optional[bool],
    typer.Option("--offload-optimizer/--no-offload-optimizer", help="Keep optimizer states in CPU memory (ZeRO 1-3). [default: off]", show_default=False),
]
OffloadParamsOption = Annotated[
    Optional[bool],
    typer.Option("--offload-params/--no-offload-params", help="Keep parameters in CPU memory (ZeRO-3). [default: off]", show_default=False),
]
SchedulerOption = Annotated[Optional[str], _opt("--lr-scheduler", "After warmup: cosine or linear decay to 0 at the last step, or constant (a run's first K steps are then the same whatever its length). [default: cosine]")]
WarmupOption = Annotated[Optional[float], _opt("--warmup-ratio", "Share of the steps spent warming the learning rate up linearly. [default: 0]")]
WeightDecayOption = Annotated[Optional[float], _opt("--weight-decay", "AdamW weight decay (not applied to biases and norms). [default: 0]")]
MaxGradNormOption = Annotated[Optional[float], _opt("--max-grad-norm", "Clip the global gradient norm to this value; 0 = no clipping. [default: 1.0]")]
NprocOption = Annotated[
    Optional[int],
    _opt("--nproc", "Processes on this machine: N > 1 re-runs the command under torchrun (gloo on CPU, NCCL on GPU). [default: 1]"),
]

TrainableLayersOption = Annotated[
    Optional[int],
    _opt("--trainable-layers", "Train only the top N transformer blocks, the final norm and the head (fast on a CPU); with --lora-rank: adapters in the top N blocks only, and the head. [default: all]"),
]

# LoRA (marlhf_cli/lora.py) ----------------------------------------------------------------
LoraRankOption = Annotated[
    Optional[int],
    _opt("--lora-rank", "Train LoRA adapters of rank R (peft) instead of every weight; 0 = full fine-tuning. The export is merged weights, with the adapter in adapter/. ppo: adapters on the actor and the critic, whose reference and reward model are then the same weights with the adapter off. [default: 0]"),
]
LoraAlphaOption = Annotated[Optional[float], _opt("--lora-alpha", "LoRA scale numerator: the update is alpha / rank x B A. [default: 2 x rank]")]
LoraDropoutOption = Annotated[Optional[float], _opt("--lora-dropout", "Dropout on the adapters' input (sft, rm; PPO runs without dropout). [default: 0]")]
LoraTargetsOption = Annotated[
    Optional[str],
    _opt("--lora-targets", "Layers that get adapters: all-linear (every linear layer of the transformer blocks, not the LM head) or comma-separated names such as q_proj,v_proj. A reward model's or critic's score head is always trained whole. [default: all-linear]"),
]


# ---------------------------------------------------------------------------------------
# marlhf ppo (defaults: marlhf_cli.config.PPOConfig, the paper's Table 5)

# what to train, from what
Name = Annotated[Optional[str], _opt("--name", "Run name: ppo/<name>, samples/<name>.jsonl, metrics/ppo-<name>.jsonl. [default: from the estimator and the rule: vanilla, fixed5, fixed-inf, ppl, parsing, code, randomized (gae; -first etc. for another --value-function), rloo, grpo, mc-fixed8, mc-ppl-m4-b3 (mc: its rule, M and B), tree-fixed8, tree-ppl-b3-d3 (tree: its rule, K and D), with -k<K> for a group size other than the default and -macro-ratio or -<aggregation> for those options]")]
Policy = Annotated[Optional[str], _opt("--policy", "Policy and reference model (hub id, folder, alias 'tiny'). [default: the run's sft/]")]
RewardModel = Annotated[Optional[str], _opt("--reward-model", "Reward model, also the critic's initialisation (hub id, folder, alias 'tiny'). With --dataset apps the reward is the tests' outcome and the critic starts from the policy unless this is given. [default: the run's rm/]")]
Reward = Annotated[Optional[List[str]], _opt("--reward", "Where scores come from: model (the reward model), apps (run the generated program on the record's tests, docs/method.md, 'Program rewards') or py:FILE.py:FUNCTION (your Python function, called as TRL's reward_funcs: prompts=, completions=, completions_ids=, and the records' other fields as keyword lists; it returns one float per response). Several, repeated or comma-separated, score with their weighted sum (--reward-weights; each one's mean is logged as score_<name>). The file is your own code, imported and run as it is, not sandboxed. Without model no rm/ is needed and the critic starts from the policy. [default: apps for --dataset apps, else model]")]
RewardWeights = Annotated[Optional[str], _opt("--reward-weights", "One weight per --reward, comma-separated, in the same order (TRL's reward_weights): the score is the weighted sum. [default: 1 each]")]

# advantage estimator
Advantage = Annotated[Optional[str], _opt("--advantage", "Advantage estimator: gae (a critic and GAE over macro actions: PPO / MA-PPO), rloo (leave-one-out group baseline), grpo (group-normalised score, KL as a loss term), mc (macro actions from --termination, each boundary valued by the mean score of --mc-rollouts continuations sampled from it, KL as a loss term) or tree (a tree of responses per prompt that branches where --termination ends a macro action, with --env where turns end; each leaf is trained on, a macro action's advantage is the mean return of the leaves below it minus its parent's); rloo, grpo, mc and tree train no critic. [default: gae]")]
SamplesPerPrompt = Annotated[Optional[int], _opt("--samples-per-prompt", "Responses sampled per prompt (K, one group); a step generates --rollout-batch-size x K responses. rloo/grpo/mc need K >= 2; tree sets it (--tree-branches ^ --tree-depth). [default: 1 for gae, 4 for rloo/grpo/mc]")]
McRollouts = Annotated[Optional[int], _opt("--mc-rollouts", "mc: continuations sampled from every inner boundary of a response (M); a boundary's value is their mean score. [default: 2]")]
TreeBranches = Annotated[Optional[int], _opt("--tree-branches", "tree: children per node (K >= 2): the prompt and the end of each of the first D - 1 macro actions are followed by K samples. [default: 2]")]
TreeDepth = Annotated[Optional[int], _opt("--tree-depth", "tree: macro actions per path before the rest of the response (D): a prompt's tree has K^D leaves, the responses a step trains on; D = 1 is a group of K responses with the group's mean return as baseline. [default: 2]")]
# multi-turn episodes
Env = Annotated[Optional[str], _opt("--env", "Train on multi-turn episodes: py:FILE.py:NAME names a class (or function) NAME(record, seed) that makes one environment per episode, with reset() -> the first user message and step(reply) -> (observation, reward, done). The policy's turns are trained on, the observations are read and never trained on, each turn's reward is placed at its last token. --termination turn makes each assistant turn one macro action; any other rule cuts inside turns. Your own code, run as it is (docs/environments.md). [default: none]")]
MaxTurns = Annotated[Optional[int], _opt("--max-turns", "--env: assistant turns per episode at most; the episode ends after the last (its reward counts). [default: 4]")]
MaxEpisodeTokens = Annotated[Optional[int], _opt("--max-episode-tokens", "--env: tokens after the prompt per episode, turns and observations together; an observation that leaves no room for another turn ends the episode. [default: --max-turns x --max-new-tokens, and 64 for each observation between turns]")]
EnvTimeout = Annotated[Optional[float], _opt("--env-timeout", "--env: seconds an environment's call (making it, reset, step) may take; a call past it stops the run in one line, the last finished step checkpointed. [default: 30]")]
McMaxBoundaries = Annotated[Optional[int], _opt("--mc-max-boundaries", "mc: at most B boundaries per response, spread evenly over the rule's (the segments between two kept ones merge), so a fine rule (ppl, parsing) costs at most B x M continuations per response. [default: every boundary]")]

# Algorithm 1 / Table 5
RolloutBatch = Annotated[Optional[int], _opt("--rollout-batch-size", "Prompts per PPO step, over all processes; each is answered --samples-per-prompt times. [default: 256]")]
MiniBatch = Annotated[Optional[int], _opt("--mini-batch-size", "Responses per optimizer step (actor and critic each), over all processes. [default: 32]")]
PPOEpochs = Annotated[Optional[int], _opt("--ppo-epochs", "Passes over each rollout batch. [default: 1]")]
ActorLr = Annotated[Optional[float], _opt("--actor-lr", "Actor (policy) learning rate. [default: 1.5e-5]")]
CriticLr = Annotated[Optional[float], _opt("--critic-lr", "Critic learning rate. [default: 1.5e-5]")]
ValueHeadInit = Annotated[Optional[str], _opt("--value-head-init", "The critic's score head at the start: reward-model (the trained head of --reward-model, the paper's start), zero (weight and bias 0: the critic starts as the constant 0) or random (a fresh random head, what every critic got before this option: its noise can be several times the returns' spread). [default: reward-model where --reward-model has a trained score head (what marlhf rm writes), zero elsewhere (a causal LM, the policy, tiny)]")]
CriticWarmupSteps = Annotated[Optional[int], _opt("--critic-warmup-steps", "The first K PPO steps train only the critic (the actor's weights, optimizer and schedule are untouched), so the actor's first update uses values that fit; they count in --max-steps and are marked critic_warmup in the metrics. [default: 0]")]
ClipRange = Annotated[Optional[float], _opt("--clip-range", "PPO ratio clip epsilon. [default: 0.2]")]
ValueClipRange = Annotated[Optional[float], _opt("--value-clip-range", "Critic value clip around the old value. [default: 0.2]")]
Gamma = Annotated[Optional[float], _opt("--gamma", "Discount over segments (macro actions). [default: 1.0]")]
Lam = Annotated[Optional[str], _opt("--lam", "GAE lambda over segments (tokens at n = 1) for the actor's advantages, in [0, 1]; or adaptive: one per response, 1 - 1 / (--lam-alpha x l), l the response's GAE steps (its tokens for token PPO, its macro actions for MA-PPO), clipped to [0, 1] (VAPO's length-adaptive lambda). [default: 0.95]")]
LamAlpha = Annotated[Optional[float], _opt("--lam-alpha", "alpha of --lam adaptive: the horizon 1 / (1 - lambda) is alpha x the response's steps. [default: 0.05, VAPO's]")]
CriticLambda = Annotated[Optional[float], _opt("--critic-lambda", "GAE lambda of the critic's targets, apart from --lam for the actor's advantages (decoupled GAE; VAPO: 1.0, the plain returns). [default: --lam's]")]
KlCoef = Annotated[Optional[float], _opt("--kl-coef", "beta of the KL to the reference: a per-token penalty -beta * KL in the reward (gae, rloo), or beta * k3 KL added to the loss (grpo, mc). [default: 0.05]")]
KlEstimator = Annotated[Optional[str], _opt("--kl-estimator", "Per-token KL estimate in the reward: k1 (log-ratio) or k3. [default: k1]")]
RewardClip = Annotated[Optional[float], _opt("--reward-clip", "Clip the (normalised) reward-model score to [-c, c] before placing it. [default: 5.0]")]
Whiten = Annotated[Optional[bool], _switch("--whiten-advantages", "Normalise advantages over each rollout batch (the paper does not). [default: off]")]
MissingEos = Annotated[Optional[float], _opt("--missing-eos-penalty", "Subtract this from the score of responses cut at --max-new-tokens (no EOS). [default: none]")]

# sampling
Temperature = Annotated[Optional[float], _opt("--temperature", "Sampling temperature (also used for every log-prob and for evaluation). [default: 0.8]")]
TopK = Annotated[Optional[int], _opt("--top-k", "Sample among the k most likely tokens; 0 = all. Only what can be drawn: log-probs (ratio, KL) are of the unfiltered logits / T. [default: 50]")]
TopP = Annotated[Optional[float], _opt("--top-p", "Nucleus sampling mass (like --top-k, it only narrows what can be drawn). [default: 1.0]")]
MaxPrompt = Annotated[Optional[int], _opt("--max-prompt-length", "Prompt tokens kept (the end of longer prompts). [default: 512]")]
MaxNewTokens = Annotated[Optional[int], _opt("--max-new-tokens", "Longest response; a response cut there has no EOS. [default: 512]")]
GenerationOption = Annotated[Optional[str], _opt("--generation", "How responses are sampled (ppo: rollouts, mc's continuations, tree rollouts and evaluation): eager (the model's forward from Python for every token), compiled (a static KV cache, each token's step recorded once as a CUDA graph and replayed: the same draws, one launch per token; on a CPU the same code without graphs) or auto (compiled on CUDA, eager on a CPU; the start-up line says which and the cache's size). A model or shape the static cache does not cover is sampled eagerly, said once. [default: auto]")]

# macro actions
Termination = Annotated[Optional[str], _opt("--termination", "Termination rule forming macro actions: fixed, randomized, ppl, parsing, code ('fixed --n 1' is vanilla PPO), or turn (--env: each assistant turn one macro action; other rules cut inside turns). [default: fixed]")]
N = Annotated[Optional[str], _opt("--n", "Segment length of the fixed rule and the text rules' fallback; 'inf' = one segment per response. [default: 5]")]
Cutoff = Annotated[Optional[int], _opt("--cutoff", "Largest segment in tokens for parsing (C) and code (C_code). [default: 5 parsing, 10 code]")]
ValueFunction = Annotated[Optional[str], _opt("--value-function", "Segment value from token values: equal (mean), unit (last), position, first. [default: equal]")]
Ratio = Annotated[Optional[str], _opt("--ratio", "The policy ratio: token (one per token, with its segment's advantage: the authors' code) or macro (one per macro action, the product of its tokens' ratios: the paper's equation). [default: token]")]
LossAggregation = Annotated[Optional[str], _opt("--loss-aggregation", "How per-token policy losses (and grpo's KL term) become one loss, for every --advantage: token-mean (over all real tokens of the batch: longer responses weigh more), sequence-mean (each response's mean, then the mean over responses: DeepSeekMath's GRPO) or token-sum (the token sum / (responses x --max-new-tokens): Dr. GRPO). docs/method.md, 'Loss aggregation'. [default: token-mean]")]
ParserBackend = Annotated[Optional[str], _opt("--parser-backend", "Parser of the parsing rule: auto, stanza, spacy. [default: auto]")]
ParseWorkers = Annotated[Optional[int], _opt("--parse-workers", "Worker processes that run the parsing/code rules while the scoring forwards run, so parsing adds no time to a step; 0 = parse in the training process after the forwards. [default: 1]")]

# schedule
MaxSteps = Annotated[Optional[int], _opt("--max-steps", "PPO steps (rollout + update). [default: 100]")]
EvalEvery = Annotated[Optional[int], _opt("--eval-every", "Mean reward on held-out prompts before training, every N steps and at the end; 0 = only at the end. [default: 10]")]
EvalPrompts = Annotated[Optional[int], _opt("--eval-prompts", "Held-out prompts per evaluation (0 turns evaluation off). [default: 64]")]
ShowSamples = Annotated[Optional[int], _opt("--show-samples", "At the end, print the first K held-out prompts with the response and score of each before training and after (the evaluations' samples: needs the one before training, --eval-every > 0). [default: 0]")]
SaveEvery = Annotated[Optional[int], _opt("--save-every", "Resume checkpoint (actor, critic, optimizers, schedules, RNG) every N steps; 0 = never. [default: 20]")]
Resume = Annotated[Optional[bool], _switch("--resume", "Continue from the run's last checkpoint (same options and seed reproduce the uninterrupted run); an error when there is none.")]
OffloadFrozen = Annotated[Optional[bool], _switch("--offload-frozen", "Keep the reference and reward model in CPU memory between their forwards. [default: off]")]

# comparison
Compare = Annotated[bool, typer.Option("--compare", help="Instead of training: draw the eval curves of the runs NAMES on one figure (plots/) and print their table.")]
Names = Annotated[Optional[List[str]], typer.Argument(help="Run names for --compare.", show_default=False)]
XAxis = Annotated[Optional[str], _opt("--x-axis", "With --compare: eval curves against the PPO step, or against tokens (generated tokens so far: responses plus mc's continuations, a tree's shared prefixes counted once: the sampling cost). [default: step]")]


# ---------------------------------------------------------------------------------------
# marlhf dpo (defaults: marlhf_cli.stage_configs.DPOConfig, the paper's Appendix C.3)

DpoPolicy = Annotated[Optional[str], _opt("--policy", "Policy to train (hub id, folder, alias 'tiny'). [default: the run's sft/]")]
Reference = Annotated[Optional[str], _opt("--reference", "The frozen reference of the implicit reward (hub id, folder, alias); it must share the policy's tokenizer. Its log-probs are computed once per pair, before the first step. With --lora-rank it is the policy with its adapter off. [default: --policy, the paper's]")]
Beta = Annotated[Optional[float], _opt("--beta", "beta > 0: the implicit reward is beta x (log pi - log pi_ref) of a response; larger keeps the policy nearer the reference. [default: 0.1, the paper's on TL;DR; --preset hh: 0.01]")]
LossType = Annotated[Optional[str], _opt("--loss-type", "sigmoid (DPO, the paper's: -log sigmoid(beta x margin)) or ipo ((margin - 1 / (2 beta))^2, on summed log-probs). [default: sigmoid]")]
LabelSmoothing = Annotated[Optional[float], _opt("--label-smoothing", "Conservative DPO: the share eps of pairs taken as mislabelled, in [0, 0.5) (sigmoid only). [default: 0]")]
LengthPenalty = Annotated[Optional[float], _opt("--length-penalty", "R-DPO's alpha >= 0: alpha x (chosen tokens - rejected tokens) joins beta x the margin inside the sigmoid (a per-token penalty in the objective), so a pair won by the longer response pushes the policy less and one won by the shorter pushes it more (every TL;DR preference set here prefers the longer summary). [default: 0]")]
DPO = {"policy": DpoPolicy, "reference": Reference, "beta": Beta, "loss_type": LossType, "label_smoothing": LabelSmoothing,
       "length_penalty": LengthPenalty}  # fmt: skip


# tracking and the Hub (marlhf_cli/tracking, marlhf_cli/hub_push.py) ---------------------------
ReportTo = Annotated[Optional[str], _opt("--report-to", "Experiment trackers, comma-separated: tensorboard (event files in tb/), wandb (offline under wandb/ without WANDB_API_KEY or WANDB_MODE), trackio (its local store, TRACKIO_DIR), mlflow (an SQLite store mlflow.db in the run directory, or MLFLOW_TRACKING_URI), or none. Each gets the config, every step's metrics and ppo's completions with their macro actions; --resume continues the same tracker run. [default: tensorboard]")]
PushToHub = Annotated[Optional[str], _opt("--push-to-hub", "Upload the stage's export (with a model card) to this Hub repository, owner/name, when the stage finishes (huggingface_hub; needs the network and a token: HF_TOKEN or huggingface-cli login).")]
TRACKING = {"report_to": ReportTo, "push_to_hub": PushToHub}


# ---------------------------------------------------------------------------------------
# groups a command takes whole (marlhf_cli.options.with_flags)

DATA = {
    "dataset": DatasetOption, "dataset_config": DatasetConfigOption, "dataset_split": DatasetSplitOption, "data_file": DataFileOption, "strict": StrictOption, "max_records": MaxRecordsOption,
    "chat_template": ChatTemplateOption,
    "split_shares": SplitSharesOption,
}  # fmt: skip
TRAINING = {  # sft and rm
    "lr": LrOption, "batch_size": BatchSizeOption, "epochs": EpochsOption, "max_steps": MaxStepsOption,
    "max_prompt_length": MaxPromptOption, "max_response_length": MaxResponseOption,
    "eval_every": EvalEveryOption, "eval_records": EvalRecordsOption, "save_every": SaveEveryOption,
    "resume": ResumeOption,
}  # fmt: skip
ENGINE = {
    "zero_stage": ZeroStageOption, "dtype": DtypeOption, "gradient_accumulation_steps": GradAccumOption,
    "gradient_checkpointing": GradCkptOption, "offload_optimizer": OffloadOptimizerOption,
    "offload_params": OffloadParamsOption, "lr_scheduler": SchedulerOption, "warmup_ratio": WarmupOption,
    "weight_decay": WeightDecayOption, "max_grad_norm": MaxGradNormOption, "nproc": NprocOption,
}  # fmt: skip
EPISODES = {"env": Env, "max_turns": MaxTurns, "max_episode_tokens": MaxEpisodeTokens, "env_timeout": EnvTimeout}  # ppo, bon
LORA = {"lora_rank": LoraRankOption, "lora_alpha": LoraAlphaOption, "lora_targets": LoraTargetsOption}  # ppo
LORA_TRAINING = {**LORA, "lora_dropout": LoraDropoutOption}  # sft and rm
PPO = {
    "name": Name, "policy": Policy, "reward_model": RewardModel, "reward": Reward, "reward_weights": RewardWeights,
    "advantage": Advantage,
    "samples_per_prompt": SamplesPerPrompt, "mc_rollouts": McRollouts, "mc_max_boundaries": McMaxBoundaries,
    "tree_branches": TreeBranches, "tree_depth": TreeDepth,
    **EPISODES,
    "rollout_batch_size": RolloutBatch, "mini_batch_size": MiniBatch,
    "ppo_epochs": PPOEpochs, "actor_lr": ActorLr, "critic_lr": CriticLr, "value_head_init": ValueHeadInit,
    "critic_warmup_steps": CriticWarmupSteps, "clip_range": ClipRange,
    "value_clip_range": ValueClipRange, "gamma": Gamma, "lam": Lam, "lam_alpha": LamAlpha,
    "critic_lambda": CriticLambda, "kl_coef": KlCoef, "kl_estimator": KlEstimator,
    "reward_clip": RewardClip, "whiten_advantages": Whiten, "missing_eos_penalty": MissingEos,
    "temperature": Temperature, "top_k": TopK, "top_p": TopP, "max_prompt_length": MaxPrompt,
    "max_new_tokens": MaxNewTokens, "generation": GenerationOption, "termination": Termination, "n": N, "cutoff": Cutoff,
    "value_function": ValueFunction, "ratio": Ratio, "loss_aggregation": LossAggregation, "parser_backend": ParserBackend, "parse_workers": ParseWorkers,
    "max_steps": MaxSteps, "eval_every": EvalEvery, "eval_prompts": EvalPrompts, "show_samples": ShowSamples, "save_every": SaveEvery,
    "resume": Resume, "offload_frozen": OffloadFrozen,
}  # fmt: skip
# flags only some estimators read (the rule's, the critic's, mc's: train/ppo/estimators.py
# says which): given on the command line to another estimator they are a one-line error
ESTIMATOR_FIELDS = ("termination", "n", "cutoff", "value_function", "critic_lr", "value_clip_range", "value_head_init",
                    "critic_warmup_steps", "lam", "lam_alpha", "critic_lambda", "samples_per_prompt", "mc_rollouts",
                    "mc_max_boundaries", "tree_branches", "tree_depth")  # estimators.py's option lists, in their order
