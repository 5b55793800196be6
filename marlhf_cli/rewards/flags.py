"""Command-line options of ``marlhf passk``.

Every option defaults to None ("not given") so flags win over ``--config`` and ``--preset``,
which win over :class:`marlhf_cli.config.PassKConfig`'s defaults, shown in each help text.
Importing this module costs nothing beyond typer.
"""

from __future__ import annotations

from typing import Annotated, Optional

from ..options import opt as _opt


Model = Annotated[Optional[str], _opt("--model", "Model that writes the programs: a run-directory stage (sft, ppo/<name>, or ppo when there is one run), a hub id, a folder or an alias ('tiny'). [default: sft]")]
Name = Annotated[Optional[str], _opt("--name", "Result name: passk/<name>.json and passk/<name>-samples.jsonl. [default: from --model, e.g. sft or ppo-<name>]")]
Dataset = Annotated[Optional[str], _opt("--dataset", "Problems: apps (codeparrot/apps, or the embedded sample offline), or a local .jsonl in APPS's shape. [default: apps]")]
DataFile = Annotated[Optional[str], _opt("--data-file", "A local JSON Lines file of APPS-style problems: the hub's rows, or question/inputs/outputs/difficulty (+ fn_name) as plain JSON values.")]
Reward = Annotated[Optional[str], _opt("--reward", "apps (run each program on the problem's tests in the sandbox) or py:FILE.py:FUNCTION: your Python function (TRL's reward_funcs convention, your own code, not sandboxed) scores every response of any prompt dataset; a response passes when it scores 1.0 or more, and the table adds the mean score. [default: apps]")]
ChatTemplate = Annotated[Optional[str], _opt("--chat-template", "auto: prompts held as conversations (chat message lists, with --reward py:) get the tokenizer's chat template; plain-text prompts such as APPS's keep their format under auto and none; a Jinja template FILE renders every prompt (a plain one as one user turn), and sampling also stops at the template's end-of-turn token. [default: auto]")]
Split = Annotated[Optional[str], _opt("--split", "eval (the hub's test split, or the held-out 10% of a file) or all. [default: eval for the hub, all for --data-file]")]
Limit = Annotated[Optional[int], _opt("--limit", "Evaluate the first P problems of the split only.")]
N = Annotated[Optional[int], _opt("--n", "Programs sampled per problem (at least the largest k). [default: 5]")]
K = Annotated[Optional[str], _opt("--k", "Comma-separated k of pass@k, estimated without bias from the n samples. [default: 1,5]")]
Temperature = Annotated[Optional[float], _opt("--temperature", "Sampling temperature (> 0). [default: 0.8]")]
TopK = Annotated[Optional[int], _opt("--top-k", "Sample from the k most likely tokens only (0 = no limit). [default: 50]")]
TopP = Annotated[Optional[float], _opt("--top-p", "Nucleus sampling mass (1 = no limit). [default: 1.0]")]
MaxPrompt = Annotated[Optional[int], _opt("--max-prompt-length", "Prompt tokens kept (the end of a longer prompt). [default: 512]")]
MaxNew = Annotated[Optional[int], _opt("--max-new-tokens", "Longest program, in tokens. [default: 512]")]
BatchSize = Annotated[Optional[int], _opt("--batch-size", "Sequences per generation batch. [default: 8]")]
TimeLimit = Annotated[Optional[float], _opt("--time-limit", "CPU seconds per test run, all its processes together (a busy machine does not change a verdict); a program that waits without computing is stopped after 5x this + 5 s of wall clock. [default: 4.0]")]
MemoryMb = Annotated[Optional[int], _opt("--memory-mb", "Address-space limit per test run, in MiB. [default: 1024]")]
Workers = Annotated[Optional[int], _opt("--workers", "Test processes run in parallel. [default: the number of CPUs]")]
MaxTests = Annotated[Optional[int], _opt("--max-tests", "Run at most this many tests per problem (APPS test problems can have hundreds). [default: all]")]
Dtype = Annotated[Optional[str], _opt("--dtype", "Model weights: auto (bf16 where the hardware multiplies bf16 fast, as for training), fp32 or bf16. [default: auto]")]
