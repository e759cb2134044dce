"""The study file's schema (pydantic v2). Its top-level shape is the product's interface.

Family and task parameters are plain dicts here; they are validated against the model-family and
task registries when the study is compiled, so a new family or task needs no change to this file.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Discriminator,
    Field,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    Tag,
    field_validator,
    model_serializer,
    model_validator,
)

from ..params import StrictParams, _prepare
from .claims_grammar import parse_claim, parse_rule
from .search import SearchSection

AXIS_ROOTS = ("task", "model", "train", "eval")
MAX_SEED = 2**31 - 1  # the ledger's INTEGER column on PostgreSQL is 32-bit
MAX_EVAL_EXAMPLES = 1_000_000


class Strict(StrictParams):
    """Study-file sections: strict types (see `studyrunner.params`), unknown keys rejected."""


def _omit_unset(data: Any, names: frozenset[str]) -> Any:
    """Knobs added after studies were run stay out of dumps (so of resolved configs and cell hashes)
    while unset (None): a cell that does not use a new knob keeps its cell_hash and trial keys."""
    if isinstance(data, dict):
        return {k: v for k, v in data.items() if not (k in names and v is None)}
    return data


class TaskSection(Strict):
    name: str = Field(description="Registered task name, e.g. 'phop' or 'addition'.")
    params: dict[str, Any] = Field(default_factory=dict, description="Task parameters (per-task schema).")


class ModelSection(Strict):
    family: str = Field(description="Registered model family, e.g. 'looped'.")
    params: dict[str, Any] = Field(default_factory=dict, description="Family parameters (per-family schema).")


_AUX_WEIGHT_KNOBS = frozenset(
    {"ponder_lambda", "ponder_lambda_warmup_steps", "regulariser_lambda", "shortcut_lambda", "consistency_lambda"}
)
_EXIT_AND_DISTILL_KNOBS = frozenset({"exit_entropy_beta", "distill_lambda", "align_beta", "align_start_step"})
# How the distillation is computed and whether the task loss is kept beside it (seed 001, section 3.3): unset
# means the paper's reading, and is written into the resolved config of every cell that distils (so their
# hashes say which objective trained them), left out of every other cell's.
DISTILL_DEFAULTS = {"task_loss": "unless_distilled", "distill_divergence": "jsd", "distill_temperature": 1.0}
JSD_BETA_DEFAULT = 0.5  # TRL's GKDConfig.beta, the library the paper used
# A trajectory schedule (models/trajectories.py): a name, {geometric: RATIO} or a list of step sizes.
Schedule = str | list[float] | dict[str, float]


def _schedule(evaluation: bool):
    def check(value: Any) -> Any:
        from ..models.trajectories import parse_spec

        return None if value is None else parse_spec(value, evaluation=evaluation)

    return check


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
        return _omit_unset(
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
    trajectory: Annotated[Schedule | None, BeforeValidator(_schedule(evaluation=False))] = Field(
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
        None,
        description="Seeds of a cell trained together in one process, as one batched model "
        "(torch.func.vmap); each seed stays its own trial with its own records and results, equal to a "
        "separate run's up to float rounding. Unset = false. Family looped only, without dropout or "
        "train.compile; no checkpoints (a group that fails restarts from step 0).",
    )

    @model_serializer(mode="wrap")
    def _omit_unset_knobs(self, handler: SerializerFunctionWrapHandler) -> Any:
        omitted = _AUX_WEIGHT_KNOBS | _EXIT_AND_DISTILL_KNOBS | _RUNTIME_KNOBS | _ENGINE_KNOBS | _OBJECTIVE_KNOBS
        data = _omit_unset(handler(self), omitted | {"checkpoint_every", "vectorize_seeds", "trajectory"})
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


class EvalSection(Strict):
    every: int = Field(100, ge=1, description="Evaluate every N steps (and always at the last step).")
    examples: int = Field(
        512, ge=1, le=MAX_EVAL_EXAMPLES, description="Held-out examples per eval split (generated in memory)."
    )
    loops: list[int] | None = Field(
        None,
        min_length=1,
        description="Test-time depth: after training, evaluate at each of these loop counts too (more than "
        "trained included), logging eval_accuracy_loops_{n} and eval_exact_match_loops_{n}.",
    )
    budgets: list[int] | None = Field(
        None,
        min_length=1,
        description="After training, evaluate the same model at each of these budgets (loop steps), logging "
        "eval_{metric}_budget_{M}: exactly M steps (loopformer: the M-step trajectory of eval.trajectory, "
        "uniform by default; other families: forward(..., loops=M)). The same mechanism as eval.loops.",
    )
    trajectory: Annotated[Schedule | None, BeforeValidator(_schedule(evaluation=True))] = Field(
        None,
        description="The trajectory of each budget (eval.budgets, eval.loops; loopformer with conditioning "
        "time_step): uniform (unset), front_loaded, back_loaded, {geometric: RATIO}, a list of step sizes, or "
        "enumerate_all: every trajectory on the 1/L grid, logging each and their spread.",
    )
    halt_collapse_fraction: float | None = Field(
        None,
        gt=0,
        le=1,
        description="Final metric halt_collapsed = 1 when the final mean halting depth is below this "
        "fraction of loops (the shallow-halt trap); unset = 0.5. Halting families only.",
    )
    representations: bool | None = Field(
        None,
        description="Representation diagnostics of the loop steps (repr_cos_step_t, repr_update_step_t, "
        "repr_erank_step_t, repr_cka_i_j, ...) at every evaluation, on a probe batch of 64 examples; unset = "
        "true. false saves their cost (about a quarter of an evaluation) and their metrics.",
    )

    @field_validator("loops", "budgets")
    @classmethod
    def _loops_positive(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (any(n < 1 or n > 4096 for n in v) or len(set(v)) != len(v)):
            raise ValueError("loop counts must be distinct and between 1 and 4096")
        return v

    @model_serializer(mode="wrap")
    def _omit_unset_knobs(self, handler: SerializerFunctionWrapHandler) -> Any:
        knobs = frozenset({"loops", "halt_collapse_fraction", "budgets", "trajectory", "representations"})
        return _omit_unset(handler(self), knobs)


class Resources(Strict):
    cpu: float = Field(1, gt=0, description="CPUs per trial (also the trial's torch thread count).")
    gpu: float = Field(0, ge=0, description="GPUs per trial; fractions share a GPU.")
    memory_gb: float | None = Field(
        None, gt=0, description="Memory reserved per trial (Ray scheduling); unset reserves none."
    )
    workers: int | None = Field(
        None,
        ge=1,
        le=4096,
        description="Data-parallel workers of each train.engine: deepspeed trial (a Ray Train run); cpu, gpu "
        "and memory_gb are then per worker. Unset: one process per trial (the plain engine).",
    )

    @model_serializer(mode="wrap")
    def _omit_unset_knobs(self, handler: SerializerFunctionWrapHandler) -> Any:
        return _omit_unset(handler(self), frozenset({"workers"}))


class MetricSpec(Strict):
    name: str = Field("eval_accuracy", pattern=r"^[a-z][a-z0-9_]*$")
    mode: Literal["max", "min"] = "max"


class AnalysisSection(Strict):
    """Options of `studyrunner analyze` / `report` (never part of a cell config or hash)."""

    solve_threshold: float | None = Field(
        None,
        description="Time to solve: the first step the study metric reaches this value (<= for mode min). "
        "Default: chance + 10% of the way to a perfect score for a per-token accuracy of a known task, else "
        "90% of the best cell mean.",
    )
    logistic_top: float | None = Field(
        None,
        description="Fix the logistic fit's ceiling at this value; default: fitted, within [the largest mean "
        "at one depth, 1 or 100].",
    )


MAX_SEQUENTIAL_SEEDS = 1000  # seeds a cell may reach under `seeds: {start, max}`; beyond it a fixed list says what runs


class SequentialSeeds(Strict):
    """`seeds: {start: 3, max: 12}`: seeds on demand until the study's claims are decided (orchestrate/waves.py,
    analysis/sequential.py). Seeds are 0, 1, 2, ... in order, so a trial's key is the one a `seeds:` list
    holding its seed gives."""

    start: int = Field(
        ge=2, le=MAX_SEQUENTIAL_SEEDS, description="Seeds every cell runs first (0 .. start-1); at least 2."
    )
    max: int = Field(
        ge=2,
        le=MAX_SEQUENTIAL_SEEDS,
        description="The most seeds a cell runs; a claim still undecided at max ends inconclusive.",
    )
    step: int | None = Field(
        None,
        ge=1,
        le=MAX_SEQUENTIAL_SEEDS,
        description="Seeds added per wave to each cell an undecided claim selects; unset: as many as fill the "
        "cluster's free trial slots (at least 1).",
    )
    spending: Literal["obrien_fleming", "pocock"] = Field(
        "obrien_fleming",
        description="Alpha-spending function of the group-sequential design (Lan-DeMets): obrien_fleming spends "
        "little at early looks, pocock evenly.",
    )

    @model_validator(mode="after")
    def _max_not_below_start(self) -> SequentialSeeds:
        if self.max < self.start:
            raise ValueError(f"max ({self.max}) must be at least start ({self.start})")
        return self


def _seeds_kind(value: Any) -> str | None:
    if isinstance(value, dict | SequentialSeeds):
        return "sequential"
    return "list" if isinstance(value, list) else None


SeedsField = Annotated[
    Annotated[list[int], Tag("list")] | Annotated[SequentialSeeds, Tag("sequential")],
    Discriminator(
        _seeds_kind,
        custom_error_type="seeds",
        custom_error_message="give a list of seeds, e.g. [0, 1, 2], or sequential seeds, e.g. {start: 3, max: 12}",
    ),
]
SEEDS_TAGS = ("list", "sequential")  # the union's tags, which error messages leave out of a field's path


def _check_claim(text: str) -> str:
    parse_claim(text)  # a GrammarError (a ValueError) names the position of the problem
    return text


class ClaimEntry(Strict):
    """One entry of `claims:`: a claim in the claims grammar, and optionally its smallest effect of interest.

    Written as a plain string (`"a[x=1] > a[x=0]"`) or as a mapping (`{claim: "a[x=1] > a[x=0]",
    min_effect: 0.05}`); a string is the mapping without `min_effect`, and an entry without one is written
    back as a string. `min_effect` (> 0) is on the claim's own scale: a difference of the metric, a slope
    per unit of x (per ln x for `ln x`), a difference of failure rates. `verify` gives the seeds its test
    needs to detect that effect with 80% power (`studyrunner.analysis.power`)."""

    claim: str = Field(description="The claim, e.g. 'eval_accuracy[loops=4] > eval_accuracy[loops=1]'.")
    min_effect: float | None = Field(
        None,
        gt=0,
        description="The smallest effect of interest, on the claim's scale (a difference of the metric, a slope "
        "per unit x or per ln x, a difference of failure rates); the seeds needed are given for it.",
    )

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        if isinstance(data, ClaimEntry):
            return data
        if isinstance(data, str):
            return {"claim": data}
        if not isinstance(data, dict):
            raise ValueError(
                f"a claim is a string such as 'a[x=1] > a[x=0]' or a mapping {{claim: '...', min_effect: 0.05}}, "
                f"not {type(data).__name__}"
            )
        return data

    @model_validator(mode="after")
    def _parses(self) -> ClaimEntry:
        parse_claim(self.claim)  # a GrammarError (a ValueError) names the position of the problem
        return self

    @model_serializer(mode="wrap")
    def _as_written(self, handler: SerializerFunctionWrapHandler) -> Any:
        return self.claim if self.min_effect is None else handler(self)

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema, handler):
        mapping = handler(core_schema)
        if handler.mode == "serialization":
            return mapping
        text = {"type": "string", "description": "A claim, e.g. 'eval_accuracy[loops=4] > eval_accuracy[loops=1]'."}
        return {"anyOf": [text, mapping]}


def claim_texts(claims) -> list[str]:
    """The texts of a `claims:` list (ClaimEntry, mappings or strings)."""
    return [c.claim if isinstance(c, ClaimEntry) else c["claim"] if isinstance(c, dict) else str(c) for c in claims]


def _check_rule(text: str) -> str:
    parse_rule(text)
    return text


class Study(Strict):
    name: str = Field(pattern=r"^[a-z0-9_-]+$", max_length=64, description="Unique per ledger.")
    description: str = ""
    task: TaskSection
    model: ModelSection
    train: TrainSection
    eval: EvalSection = Field(default_factory=EvalSection)
    grid: dict[str, list[Any]] = Field(
        default_factory=dict, description="Dotted path -> values; the Cartesian product of all axes."
    )
    zip: list[dict[str, list[Any]]] = Field(
        default_factory=list, description="Groups of dotted paths whose value lists vary together."
    )
    exclude: list[dict[str, Any]] = Field(
        default_factory=list, description="Partial configs (path -> value); matching cells are dropped."
    )
    include: list[dict[str, Any]] = Field(
        default_factory=list,
        description="Extra cells beyond the grid: each a partial config (dotted path -> value) applied to the "
        "base config, e.g. one family's ablation beside a grid over model.family.",
    )
    seeds: SeedsField = Field(
        default_factory=lambda: [0],
        description="The seeds each cell runs: a list, e.g. [0, 1, 2]; or {start, max, step, spending}: the first "
        "`start` seeds, then more in waves to the cells the undecided claims select, until every claim is decided "
        "or `max` (docs/analysis/sequential.md).",
    )
    search: SearchSection | None = Field(
        None,
        description="An Optuna search over study-file paths (docs/guide/searches.md): n_trials configurations, each "
        "run once per seed; with grid axes, one search per grid cell.",
    )
    resources: Resources = Field(default_factory=Resources)
    metric: MetricSpec = Field(default_factory=MetricSpec)
    baselines: list[Literal["iso_param", "iso_flop"]] = Field(
        default_factory=list,
        description="Matched unlooped cells added for every looped cell: iso_param (same distinct layers run "
        "once, MLP widened to match parameters) and/or iso_flop (every block application a distinct layer).",
    )
    # Read by the analysis layer only (`studyrunner verify` / `analyze`); never part of a cell config or hash.
    claims: list[ClaimEntry] = Field(
        default_factory=list,
        description="Findings the study expects, checked by `studyrunner verify`: each a string, e.g. "
        "'eval_accuracy[loops=4] > eval_accuracy[loops=1]', or a mapping {claim: ..., min_effect: 0.05} "
        "(grammar and tests: docs/analysis/claims.md).",
    )
    failure: Annotated[str, AfterValidator(_check_rule)] | None = Field(
        None,
        description="When a finished trial counts as failed, e.g. 'eval_exact_match < 0.2 or halt_collapsed' "
        "(failed trials always count).",
    )
    analysis: AnalysisSection | None = Field(
        None, description="Options of `studyrunner analyze` and `report`: solve_threshold, logistic_top."
    )
    # How trials are run, not what they compute: never part of a cell config or hash either.
    divergence: Annotated[str, AfterValidator(_check_rule)] | None = Field(
        None,
        description="When a running trial has diverged, in the failure rule's grammar, e.g. 'train_loss > 20': "
        "checked on every record against the latest value of each metric; when it holds, the trial stops "
        "there as diverged, keeping its metrics (a non-finite train loss always counts).",
    )
    retries: int = Field(
        2,
        ge=0,
        le=100,
        description="How many times a trial is retried after an infrastructure failure (a lost worker, out "
        "of memory); it resumes from its latest checkpoint. Errors in code or config and diverged trials "
        "are not retried.",
    )

    # Where the study came from, for error messages and for storing the file as written.
    _source: str = PrivateAttr("<study>")
    _node: Any = PrivateAttr(None)
    _text: str | None = PrivateAttr(None)

    @property
    def source(self) -> str:
        return self._source

    @property
    def claim_texts(self) -> list[str]:
        """The claims' texts, in order (each entry's `claim`)."""
        return claim_texts(self.claims)

    @property
    def text(self) -> str:
        """The study file as written (or a YAML dump for a study built in code)."""
        if self._text is not None:
            return self._text
        import yaml

        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    @field_validator("baselines")
    @classmethod
    def _baselines_unique(cls, kinds: list[str]) -> list[str]:
        if len(set(kinds)) != len(kinds):
            raise ValueError("each baseline kind at most once")
        return kinds

    @property
    def sequential(self) -> SequentialSeeds | None:
        """The sequential design (`seeds: {start, max}`), None for a list of seeds."""
        return self.seeds if isinstance(self.seeds, SequentialSeeds) else None

    @property
    def seed_values(self) -> list[int]:
        """Every seed a cell may run: the list, or 0 .. max-1 of a sequential design."""
        return list(range(self.seeds.max)) if self.sequential else list(self.seeds)

    @property
    def first_seeds(self) -> list[int]:
        """The seeds every cell runs from the first submit: the list, or 0 .. start-1 of a sequential design."""
        return list(range(self.seeds.start)) if self.sequential else list(self.seeds)

    @field_validator("seeds", mode="before")
    @classmethod
    def _integral_seeds(cls, seeds: Any) -> Any:
        return _prepare(list[int], seeds) if isinstance(seeds, list) else seeds

    @field_validator("seeds")
    @classmethod
    def _seeds_unique(cls, seeds: list[int] | SequentialSeeds) -> list[int] | SequentialSeeds:
        if isinstance(seeds, SequentialSeeds):
            return seeds
        if not seeds:
            raise ValueError("give at least one seed")
        if len(set(seeds)) != len(seeds):
            raise ValueError("seeds must be unique")
        if any(s < 0 or s > MAX_SEED for s in seeds):
            raise ValueError(f"seeds must be between 0 and {MAX_SEED} (what the ledger stores and torch accepts)")
        return seeds
