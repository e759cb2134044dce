"""The study file's small sections (task, model, eval, resources, metric, analysis) and what every section
shares: the strict base, the rule that new knobs left unset stay out of dumps, and the trajectory schedule
type. The train section is train_section.py; the whole study is schema.py."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, SerializerFunctionWrapHandler, field_validator, model_serializer

from ..params import StrictParams

MAX_EVAL_EXAMPLES = 1_000_000


class Strict(StrictParams):
    """Study-file sections: strict types (see `studyrunner.params`), unknown keys rejected."""


def omit_unset(data: Any, names: frozenset[str]) -> Any:
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


# A trajectory schedule (models/trajectories.py): a name, {geometric: RATIO} or a list of step sizes.
Schedule = str | list[float] | dict[str, float]


def check_schedule(evaluation: bool):
    """The validator of a trajectory schedule (train.trajectory; eval.trajectory with `evaluation`). The models
    package is imported when a schedule is given, not with the schema: it imports torch."""

    def check(value: Any) -> Any:
        from ..models.trajectories import parse_spec

        return None if value is None else parse_spec(value, evaluation=evaluation)

    return check


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
    trajectory: Annotated[Schedule | None, BeforeValidator(check_schedule(evaluation=True))] = Field(
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
    split: Literal["test", "validation"] | None = Field(
        None,
        description="The held-out split the eval_* metrics are measured on: test (unset: what claims are scored on) "
        "or validation (apart from test: what a `tune:` section chooses on, so that choosing and scoring never "
        "share examples).",
    )

    @field_validator("loops", "budgets")
    @classmethod
    def _loops_positive(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and (any(n < 1 or n > 4096 for n in v) or len(set(v)) != len(v)):
            raise ValueError("loop counts must be distinct and between 1 and 4096")
        return v

    @model_serializer(mode="wrap")
    def _omit_unset_knobs(self, handler: SerializerFunctionWrapHandler) -> Any:
        knobs = frozenset({"loops", "halt_collapse_fraction", "budgets", "trajectory", "representations", "split"})
        return omit_unset(handler(self), knobs)


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
        return omit_unset(handler(self), frozenset({"workers"}))


class MetricSpec(Strict):
    name: str = Field("eval_accuracy", pattern=r"^[a-z][a-z0-9_]*$")
    mode: Literal["max", "min"] = "max"


class TuneSection(Strict):
    """Settings chosen per cell before the seeds run (`tune:`): each cell's trial at every value of `grid`, one
    seed, scored on the validation split; the best value is the cell's, and its seeds run with it."""

    grid: dict[str, list[Any]] = Field(
        description="train.* paths and the values to try, e.g. {train.lr: [1.0e-3, 2.0e-3, 4.0e-3]} (several "
        "paths: every combination).",
    )
    metric: MetricSpec | None = Field(
        None, description="What the choice maximises or minimises on the validation split [default: the study's]."
    )
    seed: int = Field(
        1000, ge=0, le=2**31 - 1, description="The one seed every tuning trial runs (apart from the study's seeds)."
    )

    @field_validator("grid")
    @classmethod
    def _train_paths(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        if not grid:
            raise ValueError("give at least one path to tune, e.g. {train.lr: [1.0e-3, 2.0e-3, 4.0e-3]}")
        for path, values in grid.items():
            if not path.startswith("train.") or path.count(".") != 1:
                raise ValueError(f"{path!r}: only train.* settings are tuned (e.g. train.lr, train.warmup_steps)")
            if len(values) < 2 or len({repr(v) for v in values}) != len(values):
                raise ValueError(f"{path}: give at least two distinct values to choose from")
        return grid


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
