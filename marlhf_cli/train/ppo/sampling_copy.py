"""The actor as a module that can sample, whatever the ZeRO stage.

Under ZeRO 0-2 every process holds whole parameters, and sampling uses the actor's module
directly. Under ZeRO-3 each process holds a shard: running the module token by token would
all-gather every layer at every token, and running it inside one
``deepspeed.zero.GatheredParameters`` block fails, because the engine's forward hooks still
prefetch parameters that the block's exit then cannot re-partition. So under ZeRO-3 a plain
copy of the policy (no DeepSpeed hooks) is kept, and its weights are refreshed from the
gathered shards once per generation: one all-gather per rollout, then fast cached decoding.
The copy costs one model's memory, which generation needs in full anyway.
"""

from __future__ import annotations

import torch

from ... import engine as eng


class GenerationModel:
    """``model()`` returns the module to sample with, up to date with the actor's weights."""

    def __init__(self, actor, make_copy):
        self.actor = actor
        self.copy = None
        if eng.zero_stage(actor) == 3:
            self.copy = make_copy()
            self.copy.eval().requires_grad_(False)
            self.copy.to(actor.device)

    @property
    def module(self):
        """The module that samples, as it is (its config and dtype; no weights refreshed)."""
        return self.actor.module if self.copy is None else self.copy

    @torch.no_grad()
    def model(self):
        if self.copy is None:
            return self.actor.module
        source = dict(self.actor.module.named_parameters())
        target = dict(self.copy.named_parameters())
        with eng.gathered_params(self.actor):
            for name, param in target.items():
                param.copy_(source[name].data.to(param.dtype))
        return self.copy
