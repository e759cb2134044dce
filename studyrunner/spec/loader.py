"""Read a study file: safe YAML (data only, duplicate keys rejected) validated into a `Study`."""

from __future__ import annotations

import re
from pathlib import Path

import yaml
from pydantic import ValidationError

from ..errors import SpecError
from .errors import describe, spec_error
from .schema import Study


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader (no Python tags, so a study file never runs code) that rejects duplicate keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False):  # type: ignore[override]
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"duplicate key {key!r} (first at line {seen[key]})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) reads `1e-3` and `2.0e0` as strings; researchers mean numbers (YAML 1.2 floats).
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def load(path: str | Path) -> Study:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"{path}: cannot read study file ({exc})") from None
    return loads(text, source=str(path))


def loads(text: str, source: str = "<study>") -> Study:
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise SpecError(f"{source}{line}: YAML syntax error: {problem}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{source}: YAML error: {exc}") from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise SpecError(
            f"{source}: a study file is a YAML mapping with keys {', '.join(Study.model_fields)}; "
            f"got {type(data).__name__}"
        )
    try:
        study = Study.model_validate(data)
    except ValidationError as exc:
        loc, msg = describe(exc, Study)
        raise spec_error(source, node, loc, msg) from None
    study._source = source
    study._node = node
    study._text = text
    return study
