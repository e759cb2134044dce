"""Which trials can be trained as one packed model, and which trials pack together.

A pack is S trials trained in one process as one batched model (train/vectorized.py runs it): their weights
stacked along a new leading dimension, one forward over all of them, one optimizer state. Two trials pack
together when they have the same *shape*: every field of their resolved configs is equal except the seed and
the fields a member may hold on its own (`MEMBER_FIELDS`): the learning-rate schedule, weight decay, gradient
clipping, the weights of auxiliary terms (a ponder-lambda warmup, ...) and initialisation knobs (a gate's or a
halting unit's bias init). Those change numbers, not the computation: the packed step applies each member's
own (its learning rate and decay are applied per member, train/vectorized.py says how).

`train.pack: seeds` packs the seeds of each cell; `train.pack: cells` also packs cells of one shape (a grid
over learning rate, gate-bias init or ponder warmup is one pack per seed group). `train.pack_size` bounds the
members of one pack (memory: each member holds its own weights, gradients and optimizer state). Pure config
logic; nothing of Ray or PyTorch.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from .config import TrialConfig

KNOB = "train.pack"
FAMILIES = ("looped", "loopformer", "looplm", "melt", "ut_act", "adaptive_layers")  # each pinned by a test
PACK_SIZE = 32  # members of one pack unless train.pack_size says otherwise

# Fields a member may hold on its own (train.*), and model params that only initialise (model.params.*_init).
MEMBER_TRAIN_FIELDS = frozenset(
    {
        "lr",
        "warmup_steps",
        "min_lr_ratio",
        "weight_decay",
        "grad_clip",
        "ponder_lambda",
        "ponder_lambda_warmup_steps",
        "regulariser_lambda",
        "shortcut_lambda",
        "consistency_lambda",
        "exit_entropy_beta",
    }
)
MEMBER_FIELDS = tuple(f"train.{f}" for f in sorted(MEMBER_TRAIN_FIELDS)) + ("model.params.*_init",)


def pack_mode(config: Mapping[str, Any]) -> str | None:
    """'seeds', 'cells' or None (not packed) for a resolved config; `train.vectorize_seeds: true` is 'seeds'."""
    train = config["train"]
    return train.get("pack") or ("seeds" if train.get("vectorize_seeds") else None)


def check_packable(config: TrialConfig | Mapping[str, Any]) -> None:
    """Raise `ValueError` (naming train.pack) where a config's trials cannot be trained packed."""
    config = TrialConfig.of(config)
    family = config.model.family
    if family not in FAMILIES:
        raise ValueError(f"{KNOB}: family {family!r} is not supported; packed families: {', '.join(FAMILIES)}")
    params = config.model.family_params()
    if params.dropout:
        raise ValueError(
            f"{KNOB} needs model.params.dropout 0 (got {params.dropout}): packed trials would draw their "
            "dropout masks from one random stream, so they could not reproduce their separate runs"
        )
    if config.model.teacher is not None:
        raise ValueError(
            f"{KNOB}: a conversion (model.params.teacher) distils from its own teacher per trial; train it unpacked"
        )
    train = config.train
    if (train.compile or "none") != "none":
        raise ValueError(f"{KNOB} does not work with train.compile ({train.compile!r}); unset one of them")
    if train.lr_groups:
        raise ValueError(f"{KNOB} cannot be combined with train.lr_groups (one rate per packed member)")


def shape_key(config: Mapping[str, Any]) -> str:
    """A digest of everything two trials of one pack must share: the resolved config without the member
    fields (and without the seed, which is not in it). Equal keys: the trials can pack together."""
    shared = copy.deepcopy(dict(config))
    shared["train"] = {k: v for k, v in shared["train"].items() if k not in MEMBER_TRAIN_FIELDS}
    params = shared["model"]["params"]
    shared["model"]["params"] = {k: v for k, v in params.items() if not k.endswith("_init")}
    text = json.dumps(shared, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def pack_key(config: Mapping[str, Any], cell_hash: str) -> str | None:
    """The key trials pack under (None: not packed): the cell for `seeds`, the shape for `cells`."""
    mode = pack_mode(config)
    if mode is None:
        return None
    return f"cell-{cell_hash}" if mode == "seeds" else f"shape-{shape_key(config)}"


def pack_size(config: Mapping[str, Any]) -> int:
    return int(config["train"].get("pack_size") or PACK_SIZE)


def pack_groups(trials: list) -> tuple[list[list], list]:
    """`trials` (each with `.config` and `.cell_hash`) as they train: the packs (lists of 2 or more, in
    order, at most `pack_size` each) and the trials trained alone (not packed, or a pack of one)."""
    keyed: dict[str, list] = {}
    alone = []
    for trial in trials:
        key = pack_key(trial.config, trial.cell_hash)
        if key is None:
            alone.append(trial)
        else:
            keyed.setdefault(key, []).append(trial)
    packs = []
    for members in keyed.values():
        size = pack_size(members[0].config)
        for chunk in (members[i : i + size] for i in range(0, len(members), size)):
            if len(chunk) == 1:
                alone.append(chunk[0])
            else:
                packs.append(chunk)
    return packs, alone
