"""A trial's config as the trainer reads it: `TrialConfig`, frozen section models with one field per knob.

A study compiles each cell to a nested dict (study/compiler.py): validated against the study schema, every
default filled, unset knobs left out. That dict is the trial's recorded form: its cell hash and trial key,
the checkpoints' identity, the MLflow params and the provenance are made from it, and it stays what is
stored. The trainer validates it once more, where a trial starts (`run_trial`, `build_trial`,
`run_trials_together`), into the models below (`TrialConfig.of`), and reads fields from then on:
`config.train.lr`, `config.eval.budgets`, not `config["train"]["lr"]`.

The models restate the study schema's sections (study/sections.py, study/train_section.py) as types and
defaults only: the dict was validated there (ranges, rules between knobs, the distillation's defaults,
trajectory specs), so nothing is checked twice, and nothing changes value: a compiled section validated here
and dumped again (`TrialConfig.dump`) is the same dict. The study schema is not imported (train/ imports
nothing of the platform: tests/test_device.py); tests/test_train_config.py holds the two together, field by
field and default by default, over every shipped study. A knob the schema gains must be added here too: until
it is, a config that sets it is refused (`extra="forbid"`), never read wrong.

Task and family params stay mappings: each task and family validates its own (`tasks.build_task`,
`models.build_model`; `ModelConfig.family_params` for what the family declares about them).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import ConfigDict, Field, PrivateAttr

from ..models import get_family
from ..models.core import CoreParams
from ..params import StrictParams

# A trajectory schedule (models/trajectories.py): a name, {geometric: RATIO} or a list of step sizes.
Schedule = str | list[float] | dict[str, float]


class Section(StrictParams):
    """A frozen section of a resolved config: strict types, unknown keys refused (`params.StrictParams`)."""

    model_config = ConfigDict(frozen=True)

    @classmethod
    def of(cls, value: Self | Mapping[str, Any]) -> Self:
        """`value` itself when already this model, else the resolved section (a mapping) validated."""
        return value if isinstance(value, cls) else cls.model_validate(value)


class TaskConfig(Section):
    name: str
    params: dict[str, Any] = Field(default_factory=dict)  # the task's own (validated by the task)


class ModelConfig(Section):
    family: str
    params: dict[str, Any] = Field(default_factory=dict)  # the family's own (validated by the family)

    @property
    def teacher(self) -> str | None:
        """The trial key of the finished trial a conversion starts from and distils from (melt's
        `model.params.teacher`), or None."""
        return self.params.get("teacher")

    def family_params(self) -> CoreParams:
        """The params validated by the family (a `core.CoreParams`: what the family declares about them)."""
        return get_family(self.family).params_model.model_validate(self.params)  # type: ignore[return-value]


class DeepSpeedConfig(Section):
    """`train.deepspeed` (study/train_section.py `DeepSpeedSection`): DeepSpeed's knobs, unset ones None."""

    zero_stage: Literal[1, 2, 3] = 1
    gradient_accumulation_steps: int = 1
    overlap_comm: bool | None = None
    contiguous_gradients: bool | None = None
    reduce_bucket_size: int | None = None
    allgather_bucket_size: int | None = None
    stage3_prefetch_bucket_size: int | None = None
    stage3_param_persistence_threshold: int | None = None


class TrainConfig(Section):
    """`train:` (study/train_section.py `TrainSection`, where each knob is described); unset knobs None."""

    steps: int
    batch_size: int = 64
    lr: float = 1e-3
    warmup_steps: int = 0
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.98)
    grad_clip: float = 1.0
    log_every: int = 20
    # weights of the model's auxiliary terms (schedules.py)
    ponder_lambda: float | None = None
    ponder_lambda_warmup_steps: int | None = None
    regulariser_lambda: float | None = None
    shortcut_lambda: float | None = None
    consistency_lambda: float | None = None
    trajectory: Schedule | None = None
    exit_entropy_beta: float | None = None
    distill_lambda: float | None = None
    align_beta: float | None = None
    align_start_step: int | None = None
    # the distillation's objective (resolved in full where train.distill_lambda > 0)
    task_loss: Literal["unless_distilled", "always"] | None = None
    distill_divergence: Literal["forward_kl", "reverse_kl", "jsd"] | None = None
    distill_jsd_beta: float | None = None
    distill_temperature: float | None = None
    lr_groups: dict[str, float] | None = None
    checkpoint_every: int | None = None
    # how the trial computes (device.py, engine.py)
    device: Literal["auto", "cpu", "cuda"] | None = None
    precision: Literal["fp32", "tf32", "bf16"] | None = None
    compile: Literal["none", "default", "reduce_overhead"] | None = None
    engine: Literal["plain", "deepspeed"] | None = None
    deepspeed: DeepSpeedConfig | None = None
    vectorize_seeds: bool | None = None
    pack: Literal["seeds", "cells"] | None = None
    pack_size: int | None = None


class EvalConfig(Section):
    """`eval:` (study/sections.py `EvalSection`, where each knob is described); unset knobs None."""

    every: int = 100
    examples: int = 512
    loops: tuple[int, ...] | None = None
    budgets: tuple[int, ...] | None = None
    trajectory: Schedule | None = None
    halt_collapse_fraction: float | None = None
    representations: bool | None = None
    split: Literal["test", "validation"] | None = None


class TrialConfig(Section):
    """A trial's resolved config (a cell's; the seed apart), read by field. `of` keeps the dict it was made
    from as `resolved`: the recorded form, for whatever records or compares it (checkpoints)."""

    task: TaskConfig
    model: ModelConfig
    train: TrainConfig
    eval: EvalConfig

    _resolved: dict[str, Any] | None = PrivateAttr(None)

    @classmethod
    def of(cls, value: TrialConfig | Mapping[str, Any]) -> TrialConfig:
        """A resolved config (the compiled dict) validated, keeping the dict; a TrialConfig as it is."""
        if isinstance(value, cls):
            return value
        config = cls.model_validate(value)
        config._resolved = value  # type: ignore[assignment]
        return config

    def __eq__(self, other: object) -> bool:  # the fields: not which dict (if any) each was read from
        return self.__dict__ == other.__dict__ if isinstance(other, TrialConfig) else NotImplemented

    @property
    def resolved(self) -> dict[str, Any]:
        """The recorded form: the dict this config was validated from (or, made in code, its `dump`)."""
        return self._resolved if self._resolved is not None else self.dump()

    def dump(self) -> dict[str, Any]:
        """The config as a study compiles it: plain JSON types, unset knobs left out."""
        return {
            "task": self.task.model_dump(mode="json"),
            "model": self.model.model_dump(mode="json"),
            "train": self.train.model_dump(mode="json", exclude_none=True),
            "eval": self.eval.model_dump(mode="json", exclude_none=True),
        }
