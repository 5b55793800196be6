"""The forwards PPO needs, all over the same ``[prompt | response]`` layout.

A rollout sequence is a left-padded prompt of P columns followed by a right-padded response
of T columns, so one row may have padding at both ends. Three rules keep every forward
consistent (docs/method.md "Rollout quantities"):

* Position ids come from the attention mask, ``cumsum(mask) - 1`` clamped at 0, in every
  forward (sampling included), so a token sees the same position whether its row was padded
  or not, and in the rollout and the update alike.
* Log-probabilities use ``logits / temperature``, the transform sampling used; otherwise the
  PPO ratio of the first update would not be 1.
* Response token ``a_t`` sits at column ``P + t``; the logits that predict it, and the value
  of the state before it, are read at column ``P + t - 1`` (for ``a_0`` that is the last
  prompt token). So ``v[t]`` is V(s_t) with s_t = prompt + a_0..a_{t-1}: the state in which
  a_t is chosen, which is what GAE's ``delta_t = r_t + v[t+1] - v[t]`` needs.

The reward model reads its score at the response's last real token (EOS when there is one),
found from the mask, never by looking for pad ids: SmolLM2's pad token *is* its EOS
(:func:`marlhf_cli.scoring.heads.last_token_scores`).
"""

from __future__ import annotations

import contextlib

import torch

from ..generation.draw import hugging_face_model, position_ids_from_mask, unwrap
from ..scoring import heads as scoring


def logprobs_from_logits(
    logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0, *, with_entropy: bool = False
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log softmax(logits / temperature)[label], its entropy per position or None).

    One fused log-softmax, read twice: the label's entry and, with ``with_entropy``, the
    entropy ``-sum(p log p)`` (not differentiated: it is a diagnostic). On a CPU with a 49k
    vocabulary this is ~1.6x faster forward and backward than ``gather - logsumexp`` plus a
    separate softmax for the entropy, and keeps no more memory for the backward (the
    log-softmax's output instead of the scaled logits).
    """
    logits = logits.float()
    log_probs = torch.log_softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)
    picked = log_probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = None
    if with_entropy:
        with torch.no_grad():
            plain = log_probs.detach()
            entropy = -torch.einsum("...v,...v->...", plain.exp(), plain)
    return picked, entropy


@contextlib.contextmanager
def resident(model, device, offload: bool):
    """Move a frozen model (reference, reward model) to ``device`` for a block, then back to
    CPU memory when ``offload`` is set; a no-op otherwise (and for ``None``, or a model with no
    weights of its own: a LoRA model's base, :class:`marlhf_cli.lora.WithoutAdapter`)."""
    if model is None or not offload or not isinstance(model, torch.nn.Module):
        yield model
        return
    model.to(device)
    try:
        yield model
    finally:
        model.to("cpu")


def disable_dropout(model) -> None:
    """Dropout off for good: PPO's ratio must be 1 at the first update, and old log-probs,
    values and scores must not depend on a dropout draw. (Training mode stays on, which
    gradient checkpointing needs.)"""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    config = getattr(model, "config", None)
    for key in list(vars(config)) if config is not None else []:
        if "dropout" in key and isinstance(getattr(config, key), float):
            setattr(config, key, 0.0)


def policy_forward(
    model,
    sequences: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_length: int,
    temperature: float,
    *,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and optionally entropies) of the response tokens, both [B, T].

    ``model`` may be a DeepSpeed engine (its forward is then the engine's, as training
    needs) or a plain model. Only the last T + 1 positions go through the LM head
    (``logits_to_keep``): the prompt's logits are never needed.
    """
    response = sequences[:, prompt_length:]
    length = response.shape[1]
    with head_divides_by(model, temperature) as divided:
        out = model(
            input_ids=sequences,
            attention_mask=attention_mask,
            position_ids=position_ids_from_mask(attention_mask),
            use_cache=False,
            logits_to_keep=length + 1,
        )
    # columns P-1 .. P+T-2 predict a_0 .. a_{T-1}; the last column (after a_{T-1}) goes through
    # the log-softmax too and is dropped after: slicing the logits first would make the
    # log-softmax copy all of them into a contiguous tensor
    labels = torch.cat([response, response[:, -1:]], dim=1)
    logp, entropy = logprobs_from_logits(out.logits, labels, 1.0 if divided else temperature, with_entropy=with_entropy)
    return logp[:, :-1], None if entropy is None else entropy[:, :-1]


@contextlib.contextmanager
def head_divides_by(model, temperature: float):
    """Within the block, the LM head's *input* is divided by ``temperature``; yields whether
    the logits come out divided (trivially so at ``temperature`` 1).

    ``head(h / T) = head(h) / T`` for a bias-free linear head, but h has the model's width
    and the logits the vocabulary's: with a 49k vocabulary the division (and its backward)
    over the logits was a tenth of a CPU step. Only where the identity holds and keeps
    float32 precision: an fp32 ``nn.Linear`` head without bias, and no logit soft-capping
    after it (Gemma-2's tanh would not commute), neither in the config nor in its text
    config (composite models such as Gemma-3 keep it there). Elsewhere nothing changes
    (yields False: the caller divides the logits). A forward in the block that never calls
    the head module (one using its weight directly) is an error: its logits would be taken
    for divided ones.
    """
    net = unwrap(model)
    head = net.get_output_embeddings() if hasattr(net, "get_output_embeddings") else None
    linear = (
        isinstance(head, torch.nn.Linear) and head.bias is None and head.weight.dtype == torch.float32
        and not _soft_capped(getattr(net, "config", None))
    )  # fmt: skip
    if temperature == 1.0 or not linear:
        yield temperature == 1.0
        return
    calls = []

    def divide(_module, args):
        calls.append(1)
        return (args[0] / temperature, *args[1:])

    handle = head.register_forward_pre_hook(divide)
    try:
        yield True
    finally:
        handle.remove()
    if not calls:
        raise RuntimeError(
            f"{type(net).__name__}'s logits did not go through its output embedding module, so they "
            "were not divided by the temperature: head_divides_by cannot serve this model"
        )


def _soft_capped(config) -> bool:
    """Logit soft-capping in ``config`` or in its text model's config."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else None
    return any(getattr(c, "final_logit_softcapping", None) for c in (config, text) if c is not None)


class TokenValues(torch.nn.Module):
    """A critic: the reward model's scalar head applied at every position, plus the constant
    its config stores (``marlhf_value_offset``, 0 unless the head started from a reward model
    with a stored score mean), [B, L].

    A module of its own so that DeepSpeed trains it through its forward (ZeRO-3 gathers
    parameters on that path); ``.model`` is the Hugging Face model that gets saved.
    """

    def __init__(self, model):
        super().__init__()
        scoring.check_head(model)
        self.model = model
        self.config = model.config

    def forward(self, input_ids, attention_mask):
        values = scoring.token_values(self.model, input_ids, attention_mask).float()
        # a head without a bias cannot hold the reward's -mean/std: the config carries it
        # (value_head.start), so that it travels with the exported critic/
        offset = scoring.value_offset(hugging_face_model(self.model).config)
        return values + offset if offset else values

    def gradient_checkpointing_enable(self, **kwargs):
        self.model.gradient_checkpointing_enable(**kwargs)


def critic_values(critic, sequences: torch.Tensor, attention_mask: torch.Tensor, prompt_length: int) -> torch.Tensor:
    """v[t] = V(state before a_t), read at column P + t - 1: [B, T].

    ``critic`` is a :class:`TokenValues` or an engine around one.
    """
    length = sequences.shape[1] - prompt_length
    values = critic(input_ids=sequences, attention_mask=attention_mask)
    return values[:, prompt_length - 1 : prompt_length - 1 + length]
