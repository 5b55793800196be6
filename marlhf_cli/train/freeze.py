"""Train only the top of a transformer: its last N blocks, final norm and head.

Why: on a CPU a full backward pass through a 135M-parameter model costs about three
forwards, and a reward model gets most of its signal from the top layers and the new score
head. With the lower blocks frozen, autograd records nothing below the first trainable
block (the embeddings do not require gradients), so a step costs little more than a
forward pass, and the optimizer holds a fraction of the parameters.
"""

from __future__ import annotations

import torch


def transformer_blocks(model) -> torch.nn.ModuleList:
    """The model's list of transformer blocks (the ModuleList as long as ``num_hidden_layers``)."""
    wanted = getattr(model.config, "num_hidden_layers", None)
    for module in model.modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == wanted:
            return module
    raise ValueError(f"cannot find the {wanted} transformer blocks of {type(model).__name__}")


def train_top_layers(model, layers: int) -> tuple[int, int]:
    """Freeze everything except the last ``layers`` blocks and what follows them.

    "What follows" is every parameter registered after the last block (the final norm and
    the score/LM head in Hugging Face models). Returns (trainable, total) parameter counts.
    """
    blocks = transformer_blocks(model)
    keep = {id(p) for block in list(blocks)[len(blocks) - layers :] for p in block.parameters()} if layers > 0 else set()
    block_params = {id(p) for p in blocks.parameters()}
    seen_blocks = False
    for name, param in model.named_parameters():
        in_blocks = id(param) in block_params
        seen_blocks = seen_blocks or in_blocks
        after_blocks = seen_blocks and not in_blocks
        param.requires_grad_(id(param) in keep or after_blocks)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return trainable, sum(p.numel() for p in model.parameters())
