"""The study file's `train:` section: the optimizer and schedule, the auxiliary losses' weights, the
distillation's objective, how a trial computes (device, precision, compile, engine) and DeepSpeed's knobs."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from .sections import Schedule, Strict, check_schedule, omit_unset

_AUX_WEIGHT_KNOBS = frozenset(
    {"ponder_lambda", "ponder_lambda_warmup_steps", "regulariser_lambda", "shortcut_lambda", "consistency_lambda"}
)
_EXIT_AND_DISTILL_KNOBS = frozenset({"exit_entropy_beta", "distill_lambda", "align_beta", "align_start_step"})
# How the distillation is computed and whether the task loss is kept beside it (seed 001, section 3.3): unset
# means the paper's reading, and is written into the resolved config of every cell that distils (so their
# hashes say which objective trained them), left out of every other cell's.
DISTILL_DEFAULTS = {"task_loss": "unless_distilled", "distill_divergence": "jsd", "distill_temperature": 1.0}
JSD_BETA_DEFAULT = 0.5  # TRL's GKDConfig.beta, the library the paper used

_RUNTIME_KNOBS = frozenset({"device", "precision", "compile"})
_OBJECTIVE_KNOBS = frozenset({*DISTILL_DEFAULTS, "distill_jsd_beta", "lr_groups"})
_ENGINE_KNOBS = frozenset({"engine", "deepspeed"})
_STAGE_KNOBS = {  # DeepSpeed knobs that mean something at some ZeRO stages only
    "allgather_bucket_size": (1, 2),
    "stage3_prefetch_bucket_size": (3,),
    "stage3_param_persistence_threshold": (3,),
}


class DeepSpeedSection(Strict):
    """`train.deepspeed`: how a `train.engine: deepspeed` trial is partitioned over its workers. A few of
    DeepSpeed's `zero_optimization` knobs, passed through as given; unset ones keep DeepSpeed's defaults
    and stay out of the resolved config."""

    zero_stage: Literal[1, 2, 3] = Field(
        1,
        description="ZeRO stage: 1 partitions the optimizer state over the workers, 2 also the gradients, "
        "3 also the parameters (gathered layer by layer for each forward and backward).",
    )
    gradient_accumulation_steps: int = Field(
        1,
        ge=1,
        le=1024,
        description="Micro-batches per worker per optimizer step; train.batch_size stays the global batch "
        "(it must divide by resources.workers x this).",
    )
    overlap_comm: bool | None = Field(None, description="Overlap gradient reduction with the backward pass.")
    contiguous_gradients: bool | None = Field(None, description="Copy gradients into one buffer as produced.")
    reduce_bucket_size: int | None = Field(
        None, ge=1, le=2**40, description="Elements reduced at a time (DeepSpeed's default: 5e8)."
    )
    allgather_bucket_size: int | None = Field(
        None, ge=1, le=2**40, description="ZeRO 1 and 2: elements all-gathered at a time after a step."
    )
    stage3_prefetch_bucket_size: int | None = Field(
        None, ge=0, le=2**40, description="ZeRO 3: parameter elements fetched ahead of their use."
    )
    stage3_param_persistence_threshold: int | None = Field(
        None, ge=0, le=2**40, description="ZeRO 3: parameters smaller than this stay whole on every worker."
    )

    @model_serializer(mode="wrap")
    def _omit_unset_knobs(self, handler: SerializerFunctionWrapHandler) -> Any:
        return omit_unset(
            handler(self), frozenset(type(self).model_fields) - {"zero_stage", "gradient_accumulation_steps"}
        )

    @model_validator(mode="after")
    def _knobs_of_this_stage(self) -> DeepSpeedSection:
        for name, stages in _STAGE_KNOBS.items():
            if getattr(self, name) is not None and self.zero_stage not in stages:
                raise ValueError(
                    f"{name} applies to ZeRO stage {' and '.join(map(str, stages))} only; zero_stage is "
                    f"{self.zero_stage}"
                )
        return self


class TrainSection(Strict):
    steps: int = Field(ge=1, description="Optimizer steps.")
    batch_size: int = Field(64, ge=1)
    lr: float = Field(1e-3, gt=0, le=1, description="Peak learning rate (AdamW).")
    warmup_steps: int = Field(0, ge=0, description="Linear warmup steps before cosine decay.")
    min_lr_ratio: float = Field(0.1, ge=0, le=1, description="Cosine decays to lr * min_lr_ratio.")
    weight_decay: float = Field(0.1, ge=0, description="AdamW decay on matrices (not norms or biases).")
    betas: tuple[float, float] = Field((0.9, 0.98), description="AdamW betas.")
    grad_clip: float = Field(1.0, ge=0, description="Global grad-norm clip; 0 turns clipping off.")
    log_every: int = Field(20, ge=1, description="Steps between train_loss/lr/throughput records.")
    # Weights of the model's auxiliary terms (models/output.py AUX_TERMS). Unset = 0; setting one for
    # a term the cell's family does not produce is an error at validate time.
    ponder_lambda: float | None = Field(
        None, ge=0, le=1e3, description="Weight of the halting (ponder) cost; seed 003 used 0 and 0.001."
    )
    ponder_lambda_warmup_steps: int | None = Field(
        None, ge=0, description="ponder_lambda rises linearly from 0 over these steps; 0 = constant from step 1."
    )
    regulariser_lambda: float | None = Field(
        None,
        ge=-1e3,
        le=1e3,
        description="Weight of the looping regulariser (seed 002 used 1 and 10); positive pulls blocks "
        "together, negative is the paper's equation read literally.",
    )
    shortcut_lambda: float | None = Field(
        None,
        ge=0,
        le=1e3,
        description="Weight of the short run's task loss (LoopFormer objectives other than fixed); unset = 0.1, "
        "the paper's.",
    )
    consistency_lambda: float | None = Field(
        None,
        ge=0,
        le=1e3,
        description="Weight of the consistency term MSE(sg(h_full), h_short) (objectives *_consistency); unset = "
        "0.1, the paper's.",
    )
    trajectory: Annotated[Schedule | None, BeforeValidator(check_schedule(evaluation=False))] = Field(
        None,
        description="The trajectory trained at full depth (family loopformer, conditioning time_step): uniform "
        "(unset), front_loaded, back_loaded, {geometric: RATIO} or a list of step sizes summing to 1 (at most "
        "`loops` of them).",
    )
    exit_entropy_beta: float | None = Field(
        None,
        ge=0,
        le=1e3,
        description="LoopLM: weight of the exit-distribution regulariser KL(p || uniform) = log T - H(p) (Ouro's "
        "entropy term, beta ~ 0.05 in a reimplementation); unset = 0.",
    )
    distill_lambda: float | None = Field(
        None, ge=0, le=1e3, description="MELT with a teacher: weight of the distillation at every loop; unset = 0."
    )
    align_beta: float | None = Field(
        None,
        ge=0,
        le=1e3,
        description="MELT with a teacher: weight of the attention alignment to the teacher (the paper's phase 2: "
        "0.1); unset = 0.",
    )
    align_start_step: int | None = Field(
        None, ge=0, description="align_beta applies from this step on (the end of phase 1); unset = 0."
    )
    task_loss: Literal["unless_distilled", "always"] | None = Field(
        None,
        description="Whether the task loss (cross-entropy) is part of the objective beside the distillation: "
        "unless_distilled (unset; the paper's reading of MELT's section 3.3 and Table 6) drops it wherever the "
        "distillation has weight (train.distill_lambda > 0), so phase 1 is L_KD and phase 2 L_KD + beta * "
        "alignment, and the cross-entropy trains only the ablation without distillation (Table 4's '- GKD', "
        "standard SFT); always adds it to every objective. Only with train.distill_lambda.",
    )
    distill_divergence: Literal["forward_kl", "reverse_kl", "jsd"] | None = Field(
        None,
        description="The distillation divergence per token, summed over the vocabulary and averaged over tokens "
        "and loops: jsd (unset; the generalised Jensen-Shannon divergence of GKD, Agarwal et al. 2024, which the "
        "paper names: beta KL(teacher || M) + (1 - beta) KL(student || M), M = beta teacher + (1 - beta) student, "
        "with train.distill_jsd_beta), forward_kl = KL(teacher || student), reverse_kl = KL(student || teacher). "
        "Only with train.distill_lambda.",
    )
    distill_jsd_beta: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="beta of the generalised JSD (distill_divergence: jsd); unset = 0.5 (TRL's GKD default, the "
        "library the paper used). It tends to forward KL as beta -> 0 and reverse KL as beta -> 1 (up to scale).",
    )
    distill_temperature: float | None = Field(
        None,
        gt=0,
        le=100,
        description="Both distributions of the distillation are softmax(logits / temperature); unset = 1 (the paper "
        "gives none; TRL's GKD loss at its default). The divergence is not rescaled by temperature^2.",
    )
    lr_groups: dict[str, float] | None = Field(
        None,
        description="Peak learning rates of named parameter groups, e.g. {gates: 5.0e-4, rest: 8.0e-6} (MELT's "
        "Table 6). Each family names its groups (melt: gates; looplm: exit_gate; loopformer: conditioning; ut_act, "
        "adaptive_layers: router, memory; looped: memory); rest is every other parameter (unset: train.lr). The "
        "schedule (warmup, cosine to min_lr_ratio) scales every group alike. Unset: one rate, train.lr.",
    )
    checkpoint_every: int | None = Field(
        None,
        ge=1,
        description="Write a resumable checkpoint every N steps and after the last (the newest 2 are kept); "
        "unset = every max(1, steps // 10) steps, about a tenth of the run. Used when the trial has a "
        "checkpoint location (Ray trials do). Results do not depend on it.",
    )
    # How a trial computes (studyrunner/train/device.py). Unset = auto / fp32 / none, and left out of the
    # resolved config, so cells that do not set them keep their hashes.
    device: Literal["auto", "cpu", "cuda"] | None = Field(
        None,
        description="auto (unset): the GPU Ray assigned the trial (resources.gpu > 0), else the CPU; cuda "
        "fails the trial when it has no GPU.",
    )
    precision: Literal["fp32", "tf32", "bf16"] | None = Field(
        None,
        description="fp32 (unset): float32, TF32 off; tf32: TF32 matmuls on a GPU; bf16: bfloat16 autocast "
        "(float32 weights and optimizer).",
    )
    compile: Literal["none", "default", "reduce_overhead"] | None = Field(
        None,
        description="none (unset): eager; default: torch.compile of the model for training steps; "
        "reduce_overhead: the same with CUDA graphs on a GPU.",
    )
    engine: Literal["plain", "deepspeed"] | None = Field(
        None,
        description="plain (unset): one process trains the trial; deepspeed: resources.workers processes "
        "train it data-parallel with DeepSpeed ZeRO (train.deepspeed), as a Ray Train run inside the trial.",
    )
    deepspeed: DeepSpeedSection | None = Field(
        None, description="DeepSpeed settings of a train.engine: deepspeed trial (unset: zero_stage 1)."
    )
    vectorize_seeds: bool | None = Field(
        None, description="The same as train.pack: seeds (the knob's first name, kept for the files that use it)."
    )
    pack: Literal["seeds", "cells"] | None = Field(
        None,
        description="Trials trained packed, in one process as one batched model (torch.func.vmap): seeds = "
        "the seeds of each cell; cells = also the cells of one shape (equal but for the learning-rate schedule, "
        "weight decay, grad_clip, aux-term weights and *_init params). Each member stays its own trial, with its "
        "own records, checkpoints and results, equal to a separate run's up to float rounding. Unset = not "
        "packed. No dropout, train.compile, train.lr_groups or conversion teacher.",
    )
    pack_size: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="Members of one pack at most (unset: 32): each holds its own weights, gradients and "
        "optimizer state in one process.",
    )

    @model_serializer(mode="wrap")
    def _omit_unset_knobs(self, handler: SerializerFunctionWrapHandler) -> Any:
        omitted = _AUX_WEIGHT_KNOBS | _EXIT_AND_DISTILL_KNOBS | _RUNTIME_KNOBS | _ENGINE_KNOBS | _OBJECTIVE_KNOBS
        data = omit_unset(
            handler(self), omitted | {"checkpoint_every", "vectorize_seeds", "pack", "pack_size", "trajectory"}
        )
        if isinstance(data, dict) and self.distill_lambda:
            data.update({k: v for k, v in self.distill_settings().items() if data.get(k) is None})
        return data

    def distill_settings(self) -> dict[str, Any]:
        """The distillation's knobs with the paper's reading where unset (what a distilling cell resolves to)."""
        settings = {k: getattr(self, k) if getattr(self, k) is not None else v for k, v in DISTILL_DEFAULTS.items()}
        if settings["distill_divergence"] == "jsd":
            settings["distill_jsd_beta"] = (
                self.distill_jsd_beta if self.distill_jsd_beta is not None else JSD_BETA_DEFAULT
            )
        return settings

    @model_validator(mode="after")
    def _distill_knobs_need_distillation(self) -> TrainSection:
        """A distillation knob without distillation (or a JSD beta with another divergence) is refused, except
        at its default, which resolves to unset: a cell that turns the distillation off (a grid over
        distill_lambda, an include) inherits the resolved defaults of the study's base."""
        defaults = {**DISTILL_DEFAULTS, "distill_jsd_beta": JSD_BETA_DEFAULT}
        idle = {knob: not self.distill_lambda for knob in DISTILL_DEFAULTS}
        idle["distill_jsd_beta"] = not self.distill_lambda or (self.distill_divergence or "jsd") != "jsd"
        for knob, unused in idle.items():
            value = getattr(self, knob)
            if value is None or not unused:
                continue
            if value != defaults[knob]:
                if self.distill_lambda:
                    raise ValueError(
                        f"{knob} has no effect with distill_divergence {self.distill_divergence!r} (only jsd)"
                    )
                raise ValueError(
                    f"{knob} is set but nothing is distilled (train.distill_lambda is unset or 0); it only acts on a "
                    "melt cell with a teacher and train.distill_lambda > 0"
                )
            setattr(self, knob, None)
        return self

    @field_validator("lr_groups")
    @classmethod
    def _lr_groups_positive(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("lists no group; name at least one (e.g. {gates: 5.0e-4}) or leave it unset")
        for name, lr in v.items():
            if not isinstance(lr, float | int) or isinstance(lr, bool) or not 0 < lr <= 1:
                raise ValueError(f"group {name!r}: a learning rate is a number in (0, 1], got {lr!r}")
        return {name: float(lr) for name, lr in v.items()}

    @model_validator(mode="after")
    def _engine_settings(self) -> TrainSection:
        # `plain` is the default spelled out: it resolves to unset, so it keeps the cells' hashes.
        if self.engine == "plain":
            self.engine = None
        if self.engine == "deepspeed" and self.deepspeed is None:
            self.deepspeed = DeepSpeedSection()
        return self  # train.deepspeed without the engine: rejected with the cell (study/knobs.py)

    @field_validator("betas")
    @classmethod
    def _betas_in_range(cls, v: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in v):
            raise ValueError("each beta must be in [0, 1)")
        return v

    @model_validator(mode="after")
    def _warmup_shorter_than_run(self) -> TrainSection:
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be smaller than steps ({self.steps})")
        return self
