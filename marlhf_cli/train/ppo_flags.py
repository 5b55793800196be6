"""Command-line options of ``marlhf ppo`` (the data and engine options come from :mod:`.flags`).

Every option defaults to None ("not given") so that flags win over ``--config`` and
``--preset``, which win over :class:`marlhf_cli.config.PPOConfig`'s defaults (the paper's
Table 5), shown in each help text.
"""

from __future__ import annotations

from typing import Annotated, List, Optional

import typer


from ..options import opt as _opt, switch as _switch


# what to train, from what
Name = Annotated[Optional[str], _opt("--name", "Run name: ppo/<name>, samples/<name>.jsonl, metrics/ppo-<name>.jsonl. [default: from the rule: vanilla, fixed5, ppl, parsing, code, randomized]")]
Policy = Annotated[Optional[str], _opt("--policy", "Policy and reference model (hub id, folder, alias 'tiny'). [default: the run's sft/]")]
RewardModel = Annotated[Optional[str], _opt("--reward-model", "Reward model, also the critic's initialisation (hub id, folder, alias 'tiny'). With --dataset apps the reward is the tests' outcome and the critic starts from the policy unless this is given. [default: the run's rm/]")]
Reward = Annotated[Optional[str], _opt("--reward", "Where scores come from: model (the reward model) or apps (run the generated program on the record's tests, docs/method.md, 'Program rewards'). [default: apps for --dataset apps, else model]")]

# advantage estimator
Advantage = Annotated[Optional[str], _opt("--advantage", "Advantage estimator: gae (a critic and GAE over macro actions: PPO / MA-PPO), rloo (leave-one-out group baseline) or grpo (group-normalised score, KL as a loss term); rloo and grpo train no critic. [default: gae]")]
SamplesPerPrompt = Annotated[Optional[int], _opt("--samples-per-prompt", "Responses sampled per prompt (K, one group); a step generates --rollout-batch-size x K responses. rloo/grpo need K >= 2. [default: 1 for gae, 4 for rloo/grpo]")]

# Algorithm 1 / Table 5
RolloutBatch = Annotated[Optional[int], _opt("--rollout-batch-size", "Prompts per PPO step, over all processes; each is answered --samples-per-prompt times. [default: 256]")]
MiniBatch = Annotated[Optional[int], _opt("--mini-batch-size", "Responses per optimizer step (actor and critic each), over all processes. [default: 32]")]
PPOEpochs = Annotated[Optional[int], _opt("--ppo-epochs", "Passes over each rollout batch. [default: 1]")]
ActorLr = Annotated[Optional[float], _opt("--actor-lr", "Actor (policy) learning rate. [default: 1.5e-5]")]
CriticLr = Annotated[Optional[float], _opt("--critic-lr", "Critic learning rate. [default: 1.5e-5]")]
ClipRange = Annotated[Optional[float], _opt("--clip-range", "PPO ratio clip epsilon. [default: 0.2]")]
ValueClipRange = Annotated[Optional[float], _opt("--value-clip-range", "Critic value clip around the old value. [default: 0.2]")]
Gamma = Annotated[Optional[float], _opt("--gamma", "Discount over segments (macro actions). [default: 1.0]")]
Lam = Annotated[Optional[float], _opt("--lam", "GAE lambda over segments. [default: 0.95]")]
KlCoef = Annotated[Optional[float], _opt("--kl-coef", "beta of the KL to the reference: a per-token penalty -beta * KL in the reward (gae, rloo), or beta * k3 KL added to the loss (grpo). [default: 0.05]")]
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

# macro actions
Termination = Annotated[Optional[str], _opt("--termination", "Termination rule forming macro actions: fixed, randomized, ppl, parsing, code ('fixed --n 1' is vanilla PPO). [default: fixed]")]
N = Annotated[Optional[str], _opt("--n", "Segment length of the fixed rule and the text rules' fallback; 'inf' = one segment per response. [default: 5]")]
Cutoff = Annotated[Optional[int], _opt("--cutoff", "Largest segment in tokens for parsing (C) and code (C_code). [default: 5 parsing, 10 code]")]
ValueFunction = Annotated[Optional[str], _opt("--value-function", "Segment value from token values: equal (mean), unit (last), position, first. [default: equal]")]
Ratio = Annotated[Optional[str], _opt("--ratio", "Policy ratio per token (the authors' code) or per macro action (the paper's equation). [default: token]")]
ParserBackend = Annotated[Optional[str], _opt("--parser-backend", "Parser of the parsing rule: auto, stanza, spacy. [default: auto]")]
ParseWorkers = Annotated[Optional[int], _opt("--parse-workers", "Worker processes that run the parsing/code rules while the scoring forwards run, so parsing adds no time to a step; 0 = parse in the training process after the forwards. [default: 1]")]

# schedule
MaxSteps = Annotated[Optional[int], _opt("--max-steps", "PPO steps (rollout + update). [default: 100]")]
EvalEvery = Annotated[Optional[int], _opt("--eval-every", "Mean reward on held-out prompts before training, every N steps and at the end; 0 = only at the end. [default: 10]")]
EvalPrompts = Annotated[Optional[int], _opt("--eval-prompts", "Held-out prompts per evaluation (0 turns evaluation off). [default: 64]")]
SaveEvery = Annotated[Optional[int], _opt("--save-every", "Resume checkpoint (actor, critic, optimizers, schedules, RNG) every N steps; 0 = never. [default: 20]")]
Resume = Annotated[Optional[bool], _switch("--resume", "Continue from the run's last checkpoint (same options and seed reproduce the uninterrupted run).")]
OffloadFrozen = Annotated[Optional[bool], _switch("--offload-frozen", "Keep the reference and reward model in CPU memory between their forwards. [default: off]")]

# comparison
Compare = Annotated[bool, typer.Option("--compare", help="Instead of training: draw the eval curves of the runs NAMES on one figure (plots/) and print their table.")]
Names = Annotated[Optional[List[str]], typer.Argument(help="Run names for --compare.", show_default=False)]
