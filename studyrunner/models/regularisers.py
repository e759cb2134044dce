"""The looping-inspired regulariser of Saunshi et al. (seed 002, section 5).

For a stack of L layers and a block size k, each parameter group G (Attn-Q, Attn-K, Attn-V,
Attn-out, FFN-in, FFN-out) is compared between layer l and layer l+k for l = 0..L-k-1 (L-k pairs:
only adjacent blocks), by the cosine of the flattened tensors; R = mean over groups of the mean over
pairs. As lambda grows the stack is pulled toward a looped model with a k-layer block.

Sign: the paper's equation reads L_xent + lambda * R, which would push the blocks *apart*, while
its text says the aim is to make them similar and that lambda -> infinity gives a looped model. We
follow the text (the notes' reading): the term is 1 - R (cosine distance), so a positive
`train.regulariser_lambda` pulls the blocks together; a negative one is the literal equation (up to
a constant). `distance="l2"` is the mean squared difference the paper says it also tried.

Groups: Q, K and V are separate groups although the core stores them in one qkv matrix (split here
by rows). Whether norms and biases count is not stated; `params="matrices"` (default) leaves them
out, `"all"` includes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn


def parameter_groups(block: nn.Module, params: Literal["matrices", "all"] = "matrices") -> dict[str, torch.Tensor]:
    """A block's tensors by group name ('attn_q', 'attn_k', 'attn_v', 'attn_proj', 'mlp_fc', ...)."""
    groups: dict[str, torch.Tensor] = {}
    for name, tensor in block.named_parameters():
        if params == "matrices" and tensor.dim() < 2:
            continue
        key = name.removesuffix(".weight").replace(".", "_")
        if name.startswith("attn.qkv."):  # Q, K and V are separate groups in the paper
            kind = "" if name.endswith("weight") else "_bias"
            for part, chunk in zip("qkv", tensor.chunk(3, dim=0), strict=True):
                groups[f"attn_{part}{kind}"] = chunk
        else:
            groups[key] = tensor
    return groups


def block_distance(
    blocks: Sequence[nn.Module],
    k: int,
    distance: Literal["cosine", "l2"] = "cosine",
    params: Literal["matrices", "all"] = "matrices",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(the regulariser term to minimise, per-group mean cosine between layers l and l+k).

    The term is 1 - mean cosine (distance="cosine") or the mean squared difference ("l2"), averaged
    over groups and the L-k pairs. The cosines are returned for diagnostics whatever the distance."""
    if not 1 <= k < len(blocks):
        raise ValueError(f"regulariser block size k={k} needs 1 <= k < layers ({len(blocks)})")
    per_layer = [parameter_groups(b, params) for b in blocks]
    cosines: dict[str, torch.Tensor] = {}
    squared: list[torch.Tensor] = []
    for group in per_layer[0]:
        pairs = [(per_layer[l][group], per_layer[l + k][group]) for l in range(len(blocks) - k)]  # noqa: E741
        cosines[group] = torch.stack([F.cosine_similarity(a.flatten(), b.flatten(), dim=0) for a, b in pairs]).mean()
        if distance == "l2":
            squared.append(torch.stack([(a - b).pow(2).mean() for a, b in pairs]).mean())
    mean_cos = torch.stack(list(cosines.values())).mean()
    term = 1.0 - mean_cos if distance == "cosine" else torch.stack(squared).mean()
    return term, cosines
