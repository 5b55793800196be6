"""The stages' options: one dataclass per stage, defaults = the paper's hyper-parameters.

Defaults are the paper's hyper-parameters for Gemma-2B (MA-RLHF, Table 5) where the paper
gives them; where it does not (some SFT/RM details) the value is marked "ours" with the
reason. How a stage's options are resolved from defaults, presets, files and flags:
:mod:`marlhf_cli.config`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class CommonConfig:
    """Options every stage shares."""

    run_dir: str = "runs/default"
    seed: int = 42
    debug: bool = False


@dataclass
class DataConfig:
    """Which records a stage reads."""

    dataset: str = "tldr"  # tldr | hh | webgpt | apps | a local .jsonl/.json/.parquet path | a hub id owner/name
    data_file: str | None = None  # a local file in the named dataset's format (e.g. Anthropic's raw HH files)
    dataset_config: str | None = None  # a hub id's configuration (datasets.load_dataset's name)
    dataset_split: str = "train"  # the hub id's split the records come from (10% held out for evaluation)
    strict: bool = False  # any bad row is an error instead of being skipped and counted
    max_records: int | None = None  # cap on records read (quick runs)
    chat_template: str = "auto"  # auto | none | a Jinja file (marlhf_cli.chat)


@dataclass
class TrainingDataConfig(DataConfig):
    """Which records a training stage reads: also how the source is shared among them."""

    # SFT/RM/PPO shares of the source, e.g. "20/40/40"; None: the paper's (APPS 20/0/80), and
    # a file of demonstrations only (no reward model can use them) is not shared out
    split_shares: str | None = None


@dataclass
class EngineConfig:
    """DeepSpeed engine options shared by the training stages."""

    zero_stage: int = 0
    dtype: str = "auto"  # auto | fp32 | bf16: auto = bf16 where the hardware multiplies bf16 fast (precision.py)
    gradient_accumulation_steps: int = 1
    gradient_checkpointing: bool = False
    offload_optimizer: bool = False
    offload_params: bool = False
    lr_scheduler: str = "cosine"  # cosine | linear | constant
    warmup_ratio: float = 0.0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    nproc: int = 1


@dataclass
class TrackingConfig:
    """Where a training stage reports: trackers (marlhf_cli/tracking; tensorboard needs no
    account, no server, no extra library), and the Hub (marlhf_cli/hub_push.py)."""

    report_to: str = "tensorboard"  # comma list of tensorboard, wandb, trackio, mlflow, or none
    push_to_hub: str | None = None  # a Hub repository id: the stage's export is uploaded there at the end


@dataclass
class LoRAConfig:
    """LoRA adapters through peft (marlhf_cli/lora.py); rank 0 trains every weight."""

    lora_rank: int = 0
    lora_alpha: float | None = None  # ours: None = 2 x rank (a scale of 2, as TRL's and OpenRLHF's examples)
    lora_targets: str = "all-linear"  # peft's all-linear: every linear layer of the blocks (not the LM/score head)


@dataclass
class LoRATrainingConfig(LoRAConfig):
    """sft and rm also take LoRA dropout (PPO runs without any dropout: its first ratio must be 1)."""

    lora_dropout: float = 0.0


@dataclass
class SFTConfig(CommonConfig, TrainingDataConfig, EngineConfig, TrackingConfig, LoRATrainingConfig):
    model: str = "google/gemma-2b"
    lr: float = 2e-5  # ours: a common full-fine-tuning rate for 2B models
    batch_size: int = 64
    epochs: int = 1
    max_steps: int | None = None
    max_prompt_length: int = 512
    max_response_length: int = 512
    packing: bool = False
    eval_every: int = 100
    eval_records: int | None = 500  # ours: held-out records per evaluation (None = all)
    save_every: int = 200
    resume: bool = False


@dataclass
class RMConfig(CommonConfig, TrainingDataConfig, EngineConfig, TrackingConfig, LoRATrainingConfig):
    model: str | None = None  # default: the SFT model in the run directory
    lr: float = 1e-5  # ours: reward models overfit quickly at higher rates
    batch_size: int = 64
    epochs: int = 1
    max_steps: int | None = None
    max_prompt_length: int = 512
    max_response_length: int = 512
    eval_every: int = 100
    eval_records: int | None = 500  # ours: held-out pairs per evaluation (None = all)
    save_every: int = 200
    resume: bool = False
    trainable_layers: int | None = None  # ours: train only the top N blocks + head (CPU runs); None = all


@dataclass
class PPOConfig(CommonConfig, TrainingDataConfig, EngineConfig, TrackingConfig, LoRAConfig):
    name: str | None = None  # run name under ppo/<name>; default derived from the rule
    policy: str | None = None  # default: the SFT model in the run directory
    reward_model: str | None = None  # default: the reward model in the run directory
    # model (the RM's score) | apps (the program's tests) | py:FILE.py:FUNCTION (TRL's reward_funcs),
    # or several, comma-separated (their weighted sum); None: apps for --dataset apps, else model
    reward: str | None = None
    reward_weights: str | None = None  # one weight per --reward, comma-separated; None: 1 each
    # gae: critic + GAE over macro actions (PPO / MA-PPO); without a critic: rloo | grpo (group
    # baselines), mc (continuations value the macro actions), tree (responses branch at their ends)
    advantage: str = "gae"
    samples_per_prompt: int | None = None  # a group; None: 1 for gae, 4 for rloo/grpo/mc; tree: K^D
    mc_rollouts: int = 2  # mc: continuations per boundary (M)
    mc_max_boundaries: int | None = None  # mc: boundaries per response at most (B); None: every one the rule makes
    tree_branches: int = 2  # tree: children per node (K); K^D leaves per prompt
    tree_depth: int = 2  # tree: levels of macro actions (D)
    # multi-turn episodes (docs/environments.md): py:FILE.py:NAME makes one environment per episode
    env: str | None = None
    max_turns: int = 4  # assistant turns per episode at most
    max_episode_tokens: int | None = None  # turns and observations after the prompt; None: turns x --max-new-tokens + 64 per observation
    env_timeout: float = 30.0  # seconds each environment call may take
    # Algorithm 1 / Table 5
    rollout_batch_size: int = 256
    mini_batch_size: int = 32
    ppo_epochs: int = 1
    actor_lr: float = 1.5e-5
    critic_lr: float = 1.5e-5
    # zero | random | reward-model; None: the trained head where --reward-model has one, else zero
    value_head_init: str | None = None  # (docs/method.md "Starting and fitting the critic")
    critic_warmup_steps: int = 0  # ours (OpenRLHF's freezing_actor_steps): the first K steps train the critic only
    clip_range: float = 0.2
    value_clip_range: float = 0.2
    gamma: float = 1.0
    lam: float | str = 0.95  # a number in [0, 1], or "adaptive": 1 - 1 / (lam_alpha * l) per response (VAPO)
    lam_alpha: float = 0.05  # adaptive lambda's alpha (VAPO's 0.05)
    critic_lambda: float | None = None  # the critic's targets' lambda (decoupled GAE); None: --lam's
    kl_coef: float = 0.05
    kl_estimator: str = "k1"  # k1 | k3
    reward_clip: float = 5.0  # ours: bounds the RM score placed at the last token
    whiten_advantages: bool = False  # the paper does not whiten
    missing_eos_penalty: float | None = None
    # sampling
    temperature: float = 0.8
    top_k: int = 50
    top_p: float = 1.0
    max_prompt_length: int = 512
    max_new_tokens: int = 512
    # auto | eager | compiled: the token loop, or a static KV cache with each token's step
    # recorded as a CUDA graph (generation/compiled.py); auto = compiled on CUDA
    generation: str = "auto"
    # macro actions (docs/method.md, "Termination rules" and "Segment GAE")
    termination: str = "fixed"  # fixed | randomized | ppl | parsing | code | turn (--env: a turn per macro action)
    n: float = 5  # fixed-rule segment length; inf = one segment per response
    cutoff: int | None = None  # parsing C / code C_code; None = the rule's default (5 / 10)
    value_function: str = "equal"  # equal | unit | position | first
    ratio: str = "token"  # token | macro
    # how per-token policy losses become one loss (docs/method.md "Loss aggregation")
    loss_aggregation: str = "token-mean"  # token-mean | sequence-mean (DeepSeekMath) | token-sum (Dr. GRPO)
    parser_backend: str = "auto"
    parse_workers: int = 1  # text rules parse in a pool while the scoring forwards run; 0 = inline
    # schedule
    max_steps: int = 100
    eval_every: int = 10
    eval_prompts: int = 64
    show_samples: int = 0  # held-out prompts printed at the end with their responses before and after
    save_every: int = 20
    resume: bool = False
    # memory: keep the frozen reference and reward model in CPU memory between their forwards
    offload_frozen: bool = False
    allow_new_head: bool = False  # a causal LM as the reward model, a reward model as the policy: refused unless set


@dataclass
class DPOConfig(CommonConfig, TrainingDataConfig, EngineConfig, TrackingConfig, LoRATrainingConfig):
    """``marlhf dpo``: the paper's DPO baseline (Appendix C.3) on the PPO share's pairs."""

    policy: str | None = None  # default: the SFT model in the run directory
    reference: str | None = None  # default: the policy (the paper: both from the SFT model)
    beta: float = 0.1  # the paper's on TL;DR (0.01 on HH-RLHF: --preset hh)
    loss_type: str = "sigmoid"  # sigmoid (DPO) | ipo
    label_smoothing: float = 0.0  # conservative DPO's eps (sigmoid only)
    length_penalty: float = 0.0  # R-DPO's alpha, per token of length difference
    lr: float = 2e-7  # the paper's (Appendix C.3)
    batch_size: int = 64  # ours, as rm's
    epochs: int = 1
    max_steps: int | None = None
    max_prompt_length: int = 512
    max_response_length: int = 512
    eval_every: int = 100
    eval_records: int | None = 500  # ours: held-out pairs per evaluation (None = all)
    save_every: int = 200
    resume: bool = False
    allow_new_head: bool = False  # a reward model as the policy: refused unless set


@dataclass
class SegmentConfig(CommonConfig):
    rule: str = "fixed"
    n: float = 5
    cutoff: int | None = None  # per-rule default: parsing 5 (the paper's C), code 10
    tokenizer: str = "tiny"
    model: str = "smollm2-135m"  # only for the ppl rule (reference log-probs)
    backend: str = "auto"
    format: str = "text"  # text | json
    stats: bool = False


@dataclass
class BonConfig(CommonConfig, DataConfig):
    """``marlhf bon``: best-of-N reward-model scores over a temperature sweep (Figure 8)."""

    name: str | None = None  # bon/<name>.json; default derived from --policy
    policy: str | None = None  # run-dir name (sft, ppo/<name>), model id, folder or alias; default sft/
    reward_model: str | None = None  # default: the run's rm/
    reward: str | None = None  # None or model: the reward model; py:FILE.py:FUNCTION: the user's function
    n: str = "4,8,16,32"  # comma-separated N; the largest is sampled, smaller N are estimated
    temperature: str = "0.2,0.4,0.6,0.8,1.0,1.2"
    top_k: int = 0  # ours: plain temperature sampling, so the sweep is about temperature alone
    top_p: float = 1.0
    max_prompt_length: int = 512
    max_new_tokens: int = 512
    batch_size: int = 16  # sequences per generation and scoring forward
    generation: str = "auto"  # as PPOConfig.generation
    normalize: bool = False  # report (score - mean) / std with the statistics rm/ stored
    max_records: int | None = 64  # ours: distinct evaluation prompts
    env: str | None = None  # py:FILE.py:NAME: each sample an episode, scored by its return (as ppo --env)
    max_turns: int = 4
    max_episode_tokens: int | None = None
    env_timeout: float = 30.0
    allow_new_head: bool = False  # a causal LM as the reward model, a reward model as the policy: refused unless set


@dataclass
class JudgeConfig(CommonConfig):
    """``marlhf judge``: pairwise LLM-as-judge (or reward-model) win rates (Figure 4, Table 1)."""

    name: str | None = None  # judge/<name>.json; default <a>-vs-<b>
    gpt4: bool = False  # the paper's judge, gpt-4o-2024-05-13
    judge_model: str | None = None  # --model: any chat model of an OpenAI-compatible server
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"  # the key itself is never part of a config
    task: str = "auto"  # auto | tldr | hh | webgpt
    template: str | None = None  # a user's own prompt file (placeholders in templates/judge/README.md)
    both_orders: bool = False
    sample: int | None = None  # judge K pairs (the paper: 50); None = all
    concurrency: int = 4
    timeout: float = 60.0  # seconds per request
    max_retries: int = 6
    retry_wait: float = 1.0  # first backoff in seconds, doubled per retry, at most 60
    max_tokens: int = 512
    rm_judge: bool = False  # --rm: the reward model judges too (higher score wins)
    reward_model: str | None = None  # default: the run's rm/
    chat_template: str = "auto"  # how --rm renders a sample's conversation (marlhf_cli.chat)
    max_prompt_length: int = 512
    max_response_length: int = 512
    batch_size: int = 8
    strict: bool = False  # a bad row stops the command instead of being skipped and counted
    allow_new_head: bool = False  # --rm with a causal LM: refused unless set


@dataclass
class PassKConfig(CommonConfig):
    """``marlhf passk``: pass@k of a model's programs on APPS-style problems (Table 3)."""

    model: str | None = None  # run-dir stage (sft, ppo/<name>), hub id, folder or alias; default sft/
    name: str | None = None  # passk/<name>.json; default derived from --model
    dataset: str = "apps"
    data_file: str | None = None
    strict: bool = False
    reward: str | None = None  # None or apps: the tests in the sandbox; py:FILE.py:FUNCTION: the user's function
    chat_template: str = "auto"  # auto | none | FILE (marlhf_cli.chat): conversational prompts get the template
    split: str | None = None  # eval | all; default: the hub's test split, or all of a --data-file
    limit: int | None = None  # first N problems of the split
    n: int = 5  # samples per problem
    k: str = "1,5"
    temperature: float = 0.8
    top_k: int = 50
    top_p: float = 1.0
    max_prompt_length: int = 512
    max_new_tokens: int = 512
    batch_size: int = 8  # sequences per generation batch
    generation: str = "auto"  # as PPOConfig.generation
    time_limit: float = 4.0  # ours (APPS's judge: 4 s): CPU seconds per test (sandbox.Limits.time)
    env: str | None = None  # py:FILE.py:NAME: each sample an episode (pass@k with feedback turns), passing at a return of 1
    max_turns: int = 4
    max_episode_tokens: int | None = None
    env_timeout: float = 30.0
    memory_mb: int = 1024  # ours: address-space limit per test
    workers: int | None = None  # parallel test processes; default: CPU count
    max_tests: int | None = None  # tests per problem; None = all
    dtype: str = "auto"  # as EngineConfig.dtype
