"""LoRA adapters through ``peft``: adding them, the base model as the adapter switched off,
merged exports.

``--lora-rank R`` (sft, rm, ppo) freezes a model's weights and trains a rank-R update
``(alpha / R) * B A`` of each targeted linear layer instead (Hu et al., 2021), plus, for a
reward model or critic, its whole score head (peft's ``modules_to_save``). peft does the
LoRA itself; this module only decides where it goes and what the stages do with it:

* **At initialisation B = 0**, so an adapted model computes exactly what its base does (the
  update adds exact zeros). The PPO reference policy is therefore the actor with its adapter
  switched off (:class:`WithoutAdapter`, peft's ``disable_adapter()``), and the reward model
  the critic with its adapter switched off, since the critic starts from the reward model:
  no second copy of either model's weights.
* **Exports are merged weights** (what ``AutoModelFor...from_pretrained`` loads, so every
  later stage and every other tool reads them as before), with the adapter beside them in
  ``adapter/`` for PEFT users: :func:`merged_saver` saves the adapter, loads the base afresh,
  loads the adapter into it and merges it (``merge_and_unload``), exactly what a PEFT user
  does with the two folders. The next stage (rm after sft, ppo after both) starts from those
  merged weights and adds fresh adapters of its own.
* **Resume checkpoints hold the trainable parameters only** (the frozen base is reloaded
  from the same source, whose identity the checkpoint records: :func:`base_identity`), and
  the optimizer only ever sees adapter and head parameters.

Nothing here imports torch or peft at module level: the option checks run before either loads.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

from .errors import UserError

ADAPTER_DIR = "adapter"  # the PEFT adapter beside a merged export
ALL_LINEAR = "all-linear"  # peft's shorthand: every nn.Linear but the output (LM or score) head


def enabled(config: Any) -> bool:
    return bool(getattr(config, "lora_rank", 0))


def alpha(config: Any) -> float:
    """``--lora-alpha``, or twice the rank (a scale of 2, TRL's and OpenRLHF's usual choice)."""
    return float(config.lora_alpha) if config.lora_alpha is not None else 2.0 * config.lora_rank


def target_names(spec: str) -> str | list[str]:
    """``--lora-targets``: peft's ``all-linear``, or the listed module names (``q_proj,v_proj``)."""
    spec = str(spec).strip()
    if spec.lower() == ALL_LINEAR:
        return ALL_LINEAR
    names = [name.strip() for name in spec.split(",") if name.strip()]
    if not names:
        raise ValueError(spec)
    return names


def check_options(config: Any) -> None:
    """One-line errors for LoRA options that cannot go together (before torch is imported)."""
    if not enabled(config):
        return
    if getattr(config, "trainable_layers", None) == 0:
        raise UserError(
            "--trainable-layers 0 with --lora-rank puts adapters in no block: give N >= 1 "
            "(adapters in the top N blocks) or drop --lora-rank (train the head alone)"
        )


# ---------------------------------------------------------------------------------------
# adding adapters


def add_adapters(model, config: Any, *, task: str, base: str = "", top_layers: int | None = None):
    """``model`` as a peft model with fresh adapters (B = 0), everything else frozen.

    ``task``: ``"causal"`` (a policy: the LM head stays frozen) or ``"score"`` (a reward model
    or critic: its score head is trained whole). ``top_layers``: adapters in the last N
    transformer blocks only (``--trainable-layers N`` with LoRA). ``base``: the model's source,
    written into the adapter's config for PEFT users.
    """
    from peft import LoraConfig, TaskType, get_peft_model

    targets: str | list[str] = target_names(config.lora_targets)
    if top_layers is not None:
        targets = _top_block_linears(model, top_layers, targets)
    settings = LoraConfig(
        r=int(config.lora_rank),
        lora_alpha=alpha(config),
        lora_dropout=float(getattr(config, "lora_dropout", 0.0) or 0.0),
        target_modules=targets,
        task_type=TaskType.CAUSAL_LM if task == "causal" else TaskType.SEQ_CLS,  # SEQ_CLS: the score head is saved whole
    )
    try:
        with _quiet_peft():  # autocast off: the adapter keeps the model's dtype (DeepSpeed's bf16 keeps fp32 masters)
            adapted = get_peft_model(model, settings, autocast_adapter_dtype=False)
    except ValueError as err:
        raise UserError(f"--lora-targets {config.lora_targets}: {str(err).splitlines()[0]}") from None
    if base:  # peft takes the loaded model's own path, which an alias or a random init lacks
        adapted.peft_config["default"].base_model_name_or_path = loadable_base(base)
    return adapted


def loadable_base(name: str) -> str:
    """Where PEFT finds an adapter's base from any working folder: a local folder as its
    absolute path, a hub id as it is, ``smollm2-135m`` as the folder it converts to, and
    ``tiny`` (built from a seed, the same on every machine) saved once under marlhf's cache.
    A ``random:<shape>`` model is drawn on the device it runs on and has no such copy: its
    name stays, and the adapter's card says so."""
    from .models import TINY_SEED, cache_dir, load_causal_lm, load_tokenizer, random_arch, resolve_model_path

    if Path(name).is_dir():
        return str(Path(name).resolve())
    if name == "tiny" and random_arch(name) is not None:
        folder = cache_dir() / "bases" / f"tiny-seed{TINY_SEED}"
        if not (folder / "config.json").is_file():
            from .models import _fill_cache_folder

            def save(tmp: Path) -> None:
                load_causal_lm("tiny").save_pretrained(tmp)
                load_tokenizer("tiny").save_pretrained(tmp)

            _fill_cache_folder(folder, save)
        return str(folder.resolve())
    return resolve_model_path(name)


@contextlib.contextmanager
def _quiet_peft():
    """peft asks transformers a deprecated question (``is_gradient_checkpointing``) when it
    wraps a model: a warning for peft's maintainers, not for the user."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        yield


def _top_block_linears(model, layers: int, targets: str | list[str]) -> list[str]:
    """Full names of the targeted linear layers inside the last ``layers`` blocks (peft accepts
    no block selection together with its ``all-linear`` shorthand)."""
    import torch

    from .train.freeze import transformer_blocks

    blocks = transformer_blocks(model)
    top = {id(module) for block in list(blocks)[len(blocks) - layers :] for module in block.modules()}
    names = [
        name for name, module in model.named_modules()
        if id(module) in top and isinstance(module, torch.nn.Linear)
        and (targets == ALL_LINEAR or name.rsplit(".", 1)[-1] in targets)
    ]  # fmt: skip
    if not names:
        raise UserError(f"--lora-targets {','.join(targets)}: no such linear layer in the top {layers} blocks")
    return names


def trainable_summary(model) -> str:
    """``r=16, alpha 32: 4,884,480 of 139,400,000 parameters trained (3.50%)``."""
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    config = model.peft_config["default"]
    return f"LoRA r={config.r}, alpha {config.lora_alpha:g}: {trained:,} of {total:,} parameters trained ({100 * trained / total:.2f}%)"


def is_adapted(module) -> bool:
    """Whether ``module`` holds a peft model (a peft model can exist only once peft is imported)."""
    peft = sys.modules.get("peft")
    return peft is not None and any(isinstance(m, peft.PeftModel) for m in module.modules())


def peft_model(model):
    """The peft model inside an engine (``.module``) or a scoring wrapper (``.model``)."""
    import peft

    for candidate in (model, getattr(model, "module", None), getattr(getattr(model, "module", None), "model", None), getattr(model, "model", None)):
        if isinstance(candidate, peft.PeftModel):
            return candidate
    raise TypeError(f"{type(model).__name__} holds no peft model")


def load_adapter_weights(model, adapter: Path) -> None:
    """Set ``model``'s adapters (and a score head saved whole) to those saved in ``adapter``
    (a ``save_pretrained`` folder of the same rank and targets): extending a finished run."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = Path(adapter) / "adapter_model.safetensors"
    if not weights.is_file():
        raise UserError(f"{adapter}: no adapter_model.safetensors to start from")
    result = set_peft_model_state_dict(peft_model(model), load_file(str(weights)))
    if result.unexpected_keys:
        raise UserError(f"{adapter} holds adapters this model lacks ({result.unexpected_keys[0]}, ...): another --lora-rank or --lora-targets?")


@contextlib.contextmanager
def adapter_off(model):
    """Within the block, ``model`` (an engine, a scoring wrapper or a peft model) computes as its base."""
    with peft_model(model).disable_adapter():
        yield


class WithoutAdapter:
    """A LoRA model's base, with no weights of its own: a call runs ``model`` (an engine or a
    peft model) with its adapter switched off. PPO's reference policy with a LoRA actor.

    ``.module`` is the model's own module, which :func:`marlhf_cli.train.forward.unwrap` and
    the LM-head check look at; it is not an ``nn.Module``, so ``--offload-frozen`` has nothing
    to move.
    """

    def __init__(self, model):
        self.model = model
        self.module = getattr(model, "module", model)

    def __call__(self, *args, **kwargs):
        with adapter_off(self.model):
            return self.model(*args, **kwargs)


# ---------------------------------------------------------------------------------------
# exports and resume checkpoints


def merged_saver(load_base: Callable[[], Any], *, stage: str) -> Callable[[Any, Path, Path], None]:
    """A ``save(model, folder, final)`` for :func:`marlhf_cli.checkpoints.export_pretrained`: the
    adapter into ``folder/adapter`` with its model card (:func:`adapter_card`: ``stage``, e.g.
    "ppo/fixed5 actor", and the command), the merged model (``load_base()`` with the adapter
    merged in) into ``folder``, with the trained model's config (its stage's extra keys)."""

    def save(model, folder: Path, final: Path) -> None:
        import copy

        from peft import PeftModel

        adapted = peft_model(model)
        adapter = Path(folder) / ADAPTER_DIR
        adapted.save_pretrained(adapter, save_embedding_layers=False)  # embeddings never get adapters
        card = adapter_card(adapted, Path(final) / ADAPTER_DIR, stage)  # the folder it is moved to
        (adapter / "README.md").write_text(card, encoding="utf-8")
        with _quiet_peft():
            merged = PeftModel.from_pretrained(load_base(), adapter).merge_and_unload()
        merged.config = copy.deepcopy(adapted.get_base_model().config)
        merged.save_pretrained(folder)

    return save


def adapter_card(adapted, adapter: Path, stage: str) -> str:
    """The adapter's README.md (peft writes a blank template): its base, LoRA settings, the
    stage and command that trained it, and how to load it."""
    from .provenance import command_line

    settings = adapted.peft_config["default"]
    base = settings.base_model_name_or_path
    causal = str(getattr(settings.task_type, "value", settings.task_type)) == "CAUSAL_LM"
    auto = "AutoPeftModelForCausalLM" if causal else "AutoPeftModelForSequenceClassification"
    targets = settings.target_modules if isinstance(settings.target_modules, str) else ", ".join(sorted(settings.target_modules))
    random_base = str(base).startswith("random:")
    return "\n".join([
        "---", f"base_model: {base}", "library_name: peft", "tags:", "- marlhf", "- lora", f"- {stage.split()[0].split('/')[0]}",
        "---", "", f"# LoRA adapter of `marlhf {stage}`", "",
        f"- base model: `{base}`" + (" (a random-init model marlhf draws on the device it runs on: load it"
                                    " with marlhf's `load_causal_lm`)" if random_base else ""),
        f"- LoRA: rank {settings.r}, alpha {settings.lora_alpha:g}, dropout {settings.lora_dropout:g}, targets {targets}",
        f"- trained by: `marlhf {stage}`",
        f"- command: `{command_line()}`",
        "- the folder above holds the same model with this adapter merged in (no peft needed)",
        "", "```python", f"from peft import {auto}", "", f'model = {auto}.from_pretrained("{adapter.resolve()}")', "```", "",
    ])  # fmt: skip


def base_identity(config: Any, **bases: str) -> dict[str, str]:
    """What a LoRA checkpoint must share with the run resuming it besides its options: its
    frozen bases (checkpoints leave them out). A base given by name (an alias, a hub id in
    the content-addressed cache) is its name; a local folder also its weight files' sizes and
    modification times, so a base rewritten in between (sft run again) is refused."""
    if not enabled(config):
        return {}
    out = {}
    for role, name in bases.items():
        folder = Path(name)
        stamp = ""
        if folder.is_dir():
            files = sorted(p for p in folder.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
            stamp = " " + ",".join(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in files)
        out[f"lora_base_{role}"] = f"{os.fspath(name)}{stamp}"
    return out
