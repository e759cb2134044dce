"""The study file's schema (pydantic v2). Its top-level shape is the product's interface.

Family and task parameters are plain dicts here; they are validated against the model-family and
task registries when the study is compiled, so a new family or task needs no change to this file.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

AXIS_ROOTS = ("task", "model", "train", "eval")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskSection(Strict):
    name: str = Field(description="Registered task name, e.g. 'phop' or 'addition'.")
    params: dict[str, Any] = Field(default_factory=dict, description="Task parameters (per-task schema).")


class ModelSection(Strict):
    family: str = Field(description="Registered model family, e.g. 'looped'.")
    params: dict[str, Any] = Field(default_factory=dict, description="Family parameters (per-family schema).")


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
    examples: int = Field(512, ge=1, description="Held-out examples per eval split.")


class Resources(Strict):
    cpu: float = Field(1, gt=0, description="CPUs per trial (also the trial's torch thread count).")
    gpu: float = Field(0, ge=0, description="GPUs per trial; fractions share a GPU.")


class MetricSpec(Strict):
    name: str = Field("eval_accuracy", pattern=r"^[a-z][a-z0-9_]*$")
    mode: Literal["max", "min"] = "max"


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
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    resources: Resources = Field(default_factory=Resources)
    metric: MetricSpec = Field(default_factory=MetricSpec)

    # Where the study came from, for error messages and for storing the file as written.
    _source: str = PrivateAttr("<study>")
    _node: Any = PrivateAttr(None)
    _text: str | None = PrivateAttr(None)

    @property
    def source(self) -> str:
        return self._source

    @property
    def text(self) -> str:
        """The study file as written (or a YAML dump for a study built in code)."""
        if self._text is not None:
            return self._text
        import yaml

        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    @field_validator("grid")
    @classmethod
    def _grid_axes(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for path, values in grid.items():
            _check_axis_path(path)
            if not values:
                raise ValueError(f"axis {path!r} has no values; give at least one")
        return grid

    @field_validator("zip")
    @classmethod
    def _zip_groups(cls, groups: list[dict[str, list[Any]]]) -> list[dict[str, list[Any]]]:
        for i, group in enumerate(groups):
            if not group:
                raise ValueError(f"group {i} is empty; give at least one path")
            lengths = {path: len(values) for path, values in group.items()}
            for path in group:
                _check_axis_path(path)
            if len(set(lengths.values())) != 1 or 0 in lengths.values():
                raise ValueError(f"group {i}: value lists must be non-empty and of equal length, got {lengths}")
        return groups

    @field_validator("seeds")
    @classmethod
    def _seeds_unique(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError("seeds must be unique")
        if any(s < 0 for s in seeds):
            raise ValueError("seeds must be >= 0")
        return seeds

    @model_validator(mode="after")
    def _axes_distinct(self) -> Study:
        seen: set[str] = set(self.grid)
        for group in self.zip:
            for path in group:
                if path in seen:
                    raise ValueError(f"path {path!r} is varied twice (grid and zip, or two zip groups)")
                seen.add(path)
        for i, partial in enumerate(self.exclude):
            unknown = sorted(set(partial) - seen)
            if unknown:
                raise ValueError(
                    f"exclude[{i}] names {unknown}, which no grid or zip axis varies; "
                    f"varied paths: {sorted(seen) or 'none'}"
                )
        return self


def _check_axis_path(path: str) -> None:
    parts = path.split(".")
    if parts[0] not in AXIS_ROOTS or len(parts) < 2 or not all(parts):
        raise ValueError(
            f"axis {path!r} is not a dotted path under {', '.join(AXIS_ROOTS)} (e.g. 'model.params.loops')"
        )
