"""Turn YAML and pydantic errors into one-line messages: file, line, field path, what is allowed."""

from __future__ import annotations

import typing
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from ..errors import SpecError


def node_line(node: yaml.Node | None, loc: tuple[Any, ...]) -> int | None:
    """1-based line of the deepest YAML node on `loc` (falls back to the nearest parent)."""
    if node is None:
        return None
    line = node.start_mark.line + 1
    for part in loc:
        child = None
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                    child = value
                    line = key.start_mark.line + 1
                    break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
            line = child.start_mark.line + 1
        if child is None:
            break
        node = child
    return line


def dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif "." in str(part):  # a dotted grid path used as a key
            out += f"[{part!r}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "<top level>"


def _is_model(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def _fields_at(model: type[BaseModel] | None, loc: tuple[Any, ...]) -> list[str] | None:
    """Valid keys of the (nested) pydantic model that `loc` points into, if known."""
    items = None  # the model of a list's items, when the last part was a list of models (`claims:`)
    for part in loc:
        if isinstance(part, int) and items is not None:
            model, items = items, None
            continue
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        annotation = model.model_fields[part].annotation
        if typing.get_origin(annotation) is list:  # a list of sections (`claims:`): its items' model
            (item,) = typing.get_args(annotation) or (None,)
            items = item if _is_model(item) else None
            model = None
            continue
        # an optional section (`search:`), or a union with one mapping form (`seeds:` list or {start, max})
        members = [
            typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a
            for a in typing.get_args(annotation)
            if a is not type(None)
        ]
        if len(members) == 1 or sum(map(_is_model, members)) == 1:
            annotation = next((m for m in members if _is_model(m)), members[0] if members else annotation)
        model = annotation if _is_model(annotation) else None
    return sorted(model.model_fields) if model is not None else None


def _without_union_tags(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """A location without the tag pydantic puts after a tagged union's field (`seeds.sequential.start`)."""
    from .schema import SEEDS_TAGS

    return tuple(p for i, p in enumerate(loc) if not (i and loc[i - 1] == "seeds" and p in SEEDS_TAGS))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(err: ValidationError, model: type[BaseModel], prefix: tuple[Any, ...] = ()) -> tuple[tuple, str]:
    """(full loc, message) of the first error, phrased for a person editing the study file."""
    first = err.errors()[0]
    loc = _without_union_tags(tuple(first["loc"]))
    full = prefix + loc
    kind = first["type"]
    if kind == "extra_forbidden":
        valid = _fields_at(model, loc[:-1])
        msg = "unknown key" + (f"; valid keys: {', '.join(valid)}" if valid else "")
    elif kind == "missing":
        msg = "required field is missing"
    elif kind == "value_error":  # our own validators' messages already say what they got
        msg = first["msg"].removeprefix("Value error, ")
    else:
        msg = first["msg"]
        if "input" in first and not isinstance(first["input"], dict):
            msg += f" (got {_short(first['input'])})"
    more = len(err.errors()) - 1
    if more:
        msg += f" (and {more} more error{'s' if more > 1 else ''})"
    return full, msg


def spec_error(source: str, node: yaml.Node | None, loc: tuple[Any, ...], msg: str) -> SpecError:
    line = node_line(node, loc)
    where = f"{source}:{line}" if line else source
    return SpecError(f"{where}: {dotted(loc)}: {msg}")
