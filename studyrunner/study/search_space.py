"""The `search:` block: an Optuna search over study-file paths, for tuning; grids stay the way to run ablations.

    search:
      algorithm: optuna
      sampler: tpe                  # tpe | gp | cmaes | random
      n_trials: 20                  # configurations; each runs once per seed in `seeds:`
      seed: 0
      space:
        train.lr: {loguniform: [1.0e-4, 1.0e-2]}
        train.warmup_steps: {int: [0, 50]}
        model.params.d_model: {choice: [32, 64]}

The space names the paths a grid may vary. A study with `grid:`/`zip:` axes too runs one search in each grid
cell (a learning rate tuned per depth, say); a path is varied in one place only. Running a search is
orchestrate/feeds/search.py's; this module holds the block's rules, checked at `validate`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from ..params import StrictParams
from .canonical import canonical_json

KINDS = ("loguniform", "uniform", "int", "choice")
SAMPLERS = ("tpe", "gp", "cmaes", "random")
MAX_SEARCH_TRIALS = 10_000
_FORMS = "{loguniform: [low, high]}, {uniform: [low, high]}, {int: [low, high]} or {choice: [a, b, ...]}"
# Where inside a range the third probe lies: off the integers for integer bounds, so an int field refuses it.
_INSIDE = (math.sqrt(5) - 1) / 2


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class Domain(BaseModel):
    """One path's range, written `{kind: [...]}` in the study file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["loguniform", "uniform", "int", "choice"]
    low: float | int | None = None
    high: float | int | None = None
    choices: tuple[Any, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _from_mapping(cls, data: Any) -> Any:
        if isinstance(data, Domain):
            return data
        if not isinstance(data, dict) or len(data) != 1 or next(iter(data)) not in KINDS:
            raise ValueError(f"give one of {_FORMS}")
        ((kind, values),) = data.items()
        if not isinstance(values, list | tuple):
            raise ValueError(f"{kind} takes a list, e.g. {{{kind}: {'[a, b, c]' if kind == 'choice' else '[1, 8]'}}}")
        if kind == "choice":
            return {"kind": kind, "choices": tuple(_choices(values))}
        low, high = _bounds(kind, list(values))
        return {"kind": kind, "low": low, "high": high}

    @classmethod
    def __get_pydantic_json_schema__(cls, core_schema, handler) -> dict[str, Any]:
        """The form written in study files, for editors: one of four one-key mappings."""
        pair = {"type": "array", "items": {"type": "number"}, "minItems": 2, "maxItems": 2}
        forms = {
            "loguniform": pair,
            "uniform": pair,
            "int": {**pair, "items": {"type": "integer"}},
            "choice": {"type": "array", "minItems": 2, "items": {"type": ["number", "string", "boolean", "null"]}},
        }
        return {
            "description": "A range: " + _FORMS,
            "oneOf": [
                {"type": "object", "properties": {k: v}, "required": [k], "additionalProperties": False}
                for k, v in forms.items()
            ],
        }

    @model_serializer
    def _to_mapping(self) -> dict[str, list]:
        return {self.kind: list(self.choices) if self.kind == "choice" else [self.low, self.high]}

    def probes(self) -> list[Any]:
        """Values that show whether the path takes this range: both ends and a point inside (a float for
        uniform and loguniform, so an integer field refuses them), or every choice."""
        if self.kind == "choice":
            return list(self.choices)
        low, high = self.low, self.high
        if self.kind == "int":
            return [low, high, (low + high) // 2]
        if self.kind == "loguniform":
            inside = math.exp(math.log(low) + _INSIDE * (math.log(high) - math.log(low)))
        else:
            inside = low + _INSIDE * (high - low)
        return [float(low), float(high), inside]


def _choices(values: list) -> list:
    if len(values) < 2:
        raise ValueError("choice needs at least two values")
    for v in values:
        if not (v is None or isinstance(v, str | bool | int | float)):
            raise ValueError(f"choice values are numbers, strings, booleans or null (Optuna's categories); got {v!r}")
    if len({canonical_json(v) for v in values}) != len(values):
        raise ValueError("choice values must be distinct")
    return values


def _bounds(kind: str, values: list) -> tuple[Any, Any]:
    if len(values) != 2 or not all(_number(v) for v in values):
        raise ValueError(f"{kind} takes two numbers [low, high]; got {values!r}")
    low, high = values
    if kind == "int":
        if not all(float(v).is_integer() for v in values):
            raise ValueError(f"int takes two integers [low, high]; got {values!r}")
        low, high = int(low), int(high)
    if not low < high:
        raise ValueError(f"low ({low}) must be below high ({high})")
    if kind == "loguniform" and low <= 0:
        raise ValueError(f"loguniform needs 0 < low; got low {low} (use uniform for a range through 0)")
    return low, high


class SearchSection(StrictParams):
    algorithm: Literal["optuna"] = Field(description="The search library: optuna (through Ray Tune's OptunaSearch).")
    sampler: Literal["tpe", "gp", "cmaes", "random"] = Field(
        "tpe",
        description="Optuna's sampler: tpe (default), gp (Gaussian process), cmaes (numeric ranges only) or random.",
    )
    n_trials: int = Field(
        ge=1, le=MAX_SEARCH_TRIALS, description="Configurations to try (per grid cell); each runs once per seed."
    )
    seed: int = Field(0, ge=0, le=2**31 - 1, description="Seeds the sampler: the same file suggests the same configs.")
    max_concurrent: int = Field(
        1,
        ge=1,
        le=1000,
        description="Configurations evaluated at once (per grid cell). 1: each suggestion sees every earlier result, "
        "so a search is reproducible; more: faster on a cluster, less informed.",
    )
    space: dict[str, Domain] = Field(
        min_length=1, description="Dotted path -> range, e.g. train.lr: {loguniform: [a, b]}."
    )
