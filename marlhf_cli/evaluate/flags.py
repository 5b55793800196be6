"""Command-line options of ``marlhf bon`` and ``marlhf judge``.

Every option defaults to None ("not given") so flags win over ``--config`` and ``--preset``,
which win over :class:`marlhf_cli.config.BonConfig` / ``JudgeConfig`` defaults, shown in
each help text. Importing this module costs nothing beyond typer.
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer


from ..options import opt as _opt, switch as _switch


# bon ---------------------------------------------------------------------------------------
BonName = Annotated[Optional[str], _opt("--name", "Result name: bon/<name>.json, plots/bon-<name>.png. [default: from --policy, e.g. sft or ppo-<name>]")]
BonPolicy = Annotated[Optional[str], _opt("--policy", "Policy to sample: a run-directory stage (sft, dpo, ppo/<name>, or ppo when there is one run), a hub id, a folder or an alias ('tiny'); several, comma-separated, are each swept on the same prompts and compared in one table (bon/<name>.json, name 'policies' by default). [default: sft]")]
BonRewardModel = Annotated[Optional[str], _opt("--reward-model", "Reward model that scores the samples (hub id, folder, alias 'tiny'). [default: the run's rm/]")]
BonReward = Annotated[Optional[str], _opt("--reward", "What scores the samples: model (--reward-model) or py:FILE.py:FUNCTION, your Python function called as TRL's reward_funcs (prompts=, completions=, completions_ids=, the records' other fields); your own code, not sandboxed. [default: model]")]
BonN = Annotated[Optional[str], _opt("--n", "Comma-separated N of best-of-N; the largest is sampled per prompt, smaller N are estimated from the same samples. [default: 4,8,16,32]")]
BonTemperature = Annotated[Optional[str], _opt("--temperature", "Comma-separated sampling temperatures, one generation each. [default: 0.2,0.4,0.6,0.8,1.0,1.2]")]
BonTopK = Annotated[Optional[int], _opt("--top-k", "Sample from the k most likely tokens only (0 = no limit). [default: 0]")]
BonTopP = Annotated[Optional[float], _opt("--top-p", "Nucleus sampling mass (1 = no limit). [default: 1.0]")]
BonMaxPrompt = Annotated[Optional[int], _opt("--max-prompt-length", "Prompt tokens kept (the end of a longer prompt). [default: 512]")]
BonMaxNew = Annotated[Optional[int], _opt("--max-new-tokens", "Longest response, in tokens. [default: 512]")]
BonBatch = Annotated[Optional[int], _opt("--batch-size", "Sequences per generation and scoring forward. [default: 16]")]
BonNormalize = Annotated[Optional[bool], _switch("--normalize", "Report (score - mean) / std with the held-out statistics 'marlhf rm' stored in the reward model. [default: no-normalize]")]
BonMaxRecords = Annotated[Optional[int], _opt("--max-records", "Distinct evaluation prompts to use (from the dataset's eval split). [default: 64]")]

# judge -------------------------------------------------------------------------------------
JudgeName = Annotated[Optional[str], _opt("--name", "Result name: judge/<name>.json, plots/judge-<name>.png. [default: <a>-vs-<b> from the file names]")]
Gpt4 = Annotated[Optional[bool], typer.Option("--gpt4", help="Judge with the paper's GPT-4o (gpt-4o-2024-05-13) unless --model names another.", show_default=False)]
JudgeModel = Annotated[Optional[str], _opt("--model", "Judge model: any chat model of the OpenAI-compatible server (implies an LLM judge). [default with --gpt4: gpt-4o-2024-05-13]")]
BaseUrl = Annotated[Optional[str], _opt("--base-url", "OpenAI-compatible server, e.g. http://localhost:8000/v1 (vLLM). [default: $OPENAI_BASE_URL, else api.openai.com]")]
ApiKeyEnv = Annotated[Optional[str], _opt("--api-key-env", "Environment variable holding the API key (the key itself is never a flag, logged or written). [default: OPENAI_API_KEY]")]
Task = Annotated[Optional[str], _opt("--task", "Built-in judge prompt: tldr (summaries), hh (dialogue), webgpt (QA, per criterion), or auto (from the prompts). [default: auto]")]
Template = Annotated[Optional[str], _opt("--template", "Your own judge prompt file with {{prompt}}, {{response_a}}, {{response_b}} (templates/judge/README.md).")]
BothOrders = Annotated[Optional[bool], _switch("--both-orders", "Judge every pair twice, each response shown first once, to cancel and measure position bias. [default: no-both-orders]")]
Sample = Annotated[Optional[int], _opt("--sample", "Judge K pairs drawn at random (seeded); the paper uses 50. [default: all]")]
Concurrency = Annotated[Optional[int], _opt("--concurrency", "Requests in flight at once. [default: 4]")]
Timeout = Annotated[Optional[float], _opt("--timeout", "Seconds to wait for one reply before retrying. [default: 60]")]
MaxRetries = Annotated[Optional[int], _opt("--max-retries", "Retries per judgement on 429, 5xx, timeouts and dropped connections. [default: 6]")]
RetryWait = Annotated[Optional[float], _opt("--retry-wait", "First backoff in seconds, doubled per retry (with jitter, at most 60; a server's Retry-After is honoured). [default: 1]")]
MaxTokens = Annotated[Optional[int], _opt("--max-tokens", "Longest judge reply, in tokens. [default: 512]")]
RmJudge = Annotated[Optional[bool], typer.Option("--rm", help="Also (or only) let the reward model judge: the higher score wins; with an LLM verdict for the same pairs an agreement table follows.", show_default=False)]
JudgeRewardModel = Annotated[Optional[str], _opt("--reward-model", "Reward model for --rm (hub id, folder, alias). [default: the run's rm/]")]
JudgeMaxPrompt = Annotated[Optional[int], _opt("--max-prompt-length", "Prompt tokens the reward model reads (--rm). [default: 512]")]
JudgeMaxResponse = Annotated[Optional[int], _opt("--max-response-length", "Response tokens the reward model reads (--rm). [default: 512]")]
JudgeBatch = Annotated[Optional[int], _opt("--batch-size", "Sequences per reward-model forward (--rm). [default: 8]")]
JudgeChatTemplate = Annotated[Optional[str], _opt("--chat-template", "How --rm renders a sample whose row carries its conversation (marlhf ppo writes it for conversational data): auto (the reward model's tokenizer's chat template), none (the Human:/Assistant: transcript), or a Jinja template FILE (every sample). Use what 'marlhf rm' used. [default: auto]")]
