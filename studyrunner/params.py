"""The base of every schema a study file is validated against (pure pydantic, no platform imports).

Study files are read strictly: a string or a boolean is never a number, a number is never a boolean,
and non-finite floats (`.inf`, `.nan`) are rejected. The conversions kept: an integral float for an int
(`steps: 1e4`, `loops: 4.0`), since YAML writes large counts that way, and a YAML list for a tuple.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


def _is_int_annotation(annotation: Any) -> bool:
    return annotation is int


def _integral(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def _prepare(annotation: Any, value: Any) -> Any:
    """int <- 4.0, list[int] <- [1.0, 2.0], int | None <- 4.0, tuple <- YAML list; else unchanged."""
    if _is_int_annotation(annotation):
        return _integral(value)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):  # Optional[X]: prepare for the one non-None member
        members = [a for a in args if a is not type(None)]
        return _prepare(members[0], value) if len(members) == 1 else value
    if origin in (list, tuple) and isinstance(value, list):
        if args and _is_int_annotation(args[0]):
            value = [_integral(v) for v in value]
        return tuple(value) if origin is tuple else value  # YAML has no tuples; strict mode wants one
    return value


class StrictParams(BaseModel):
    """Strict types, unknown keys rejected, finite floats only; integral floats accepted for ints."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _integral_floats(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = dict(data)
        for name, info in cls.model_fields.items():
            if name in out:
                out[name] = _prepare(info.annotation, out[name])
        return out
