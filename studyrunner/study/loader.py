"""Read a study file: safe YAML (data only) validated into a `Study`.

Rules a study file is read by, each covering a class of bad input rather than one case:
- Safe YAML only (no Python tags): a study file never imports or runs code.
- Duplicate keys are rejected; merge keys (`<<: *base`) are supported, and keys written beside a merge
  override the merged ones, as YAML intends. Top-level keys starting with `x-` hold anchors and are
  otherwise ignored.
- Aliases may not expand past `MAX_NODES` values (a "billion laughs" file is rejected before it is
  built) and may not refer to themselves.
- Control characters (NUL, ...) are rejected with their line and column.
- `.inf` and `.nan` are rejected wherever they appear: no field of a study takes them.
- Types are strict (`studyrunner.params`): "4" is not a number, 1 is not a boolean, and (as in YAML
  1.2) only true/false are booleans: `yes`, `no`, `on`, `off` are strings.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..errors import SpecError
from .checks import check_study
from .schema import Study
from .spec_errors import describe, spec_error

MAX_NODES = 100_000  # values after alias expansion; real study files have a few hundred
MAX_BYTES = 4 * 1024 * 1024


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys (merge keys excepted) and resolves YAML 1.2 floats."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False):  # type: ignore[override]
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key (a list or mapping used as a key)
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, "a key must be a plain value", key_node.start_mark
                ) from None
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping",
                    node.start_mark,
                    f"duplicate key {key!r} (first at line {seen[key]})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)  # SafeConstructor flattens `<<` merges here


# YAML 1.1 (PyYAML) reads `1e-3` and `2.0e0` as strings; researchers mean numbers (YAML 1.2 floats).
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


# YAML 1.1 also reads yes/no/on/off as booleans (`country: no` -> False); YAML 1.2 and every other
# config reader researchers use take only true/false. Read those alone as booleans; `bias: yes` is then
# the string it looks like, which a boolean field rejects.
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != "tag:yaml.org,2002:bool"]
    for first, resolvers in _StrictLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def _expanded_size(root: yaml.Node, source: str) -> int:
    """Values the node graph expands to once aliases are copied out; memoised, so it is linear in
    the graph even when the expansion is exponential."""
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            line = node.start_mark.line + 1
            raise SpecError(f"{source}:{line}: YAML alias refers to itself; a study file is a tree of values")
        active.add(key)
        if isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(v) for v in node.value)
        else:
            total = 1
        active.discard(key)
        sizes[key] = min(total, MAX_NODES + 1)  # saturate: the exact count past the limit is not needed
        return sizes[key]

    return size(root)


def _non_finite(data: Any, loc: tuple = ()) -> tuple | None:
    """Path of the first .inf/.nan in the document, if any."""
    if isinstance(data, float) and not math.isfinite(data):
        return loc
    if isinstance(data, dict):
        items = data.items()
    elif isinstance(data, list):
        items = enumerate(data)
    else:
        return None
    for key, value in items:
        found = _non_finite(value, (*loc, key))
        if found is not None:
            return found
    return None


def load(path: str | Path) -> Study:
    path = Path(path)
    try:
        if path.is_dir():
            raise SpecError(f"{path}: is a folder; give the study file (YAML) inside it")
        if path.stat().st_size > MAX_BYTES:
            raise SpecError(f"{path}: {path.stat().st_size:,} bytes; a study file is at most {MAX_BYTES:,}")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except UnicodeDecodeError as exc:
        raise SpecError(f"{path}: not UTF-8 text (byte {exc.start}); save the study file as UTF-8") from None
    except OSError as exc:
        raise SpecError(f"{path}: cannot read study file ({exc.strerror or exc})") from None
    return loads(text, source=str(path))


def _parse(text: str, source: str) -> tuple[Any, yaml.Node | None]:
    loader = None
    try:
        loader = _StrictLoader(text)  # the reader rejects control characters here
        node = loader.get_single_node()
        if node is not None and _expanded_size(node, source) > MAX_NODES:
            raise SpecError(
                f"{source}: YAML aliases expand to more than {MAX_NODES:,} values; "
                "a study file needs far fewer (use grid axes instead of copied blocks)"
            )
        data = loader.construct_document(node) if node is not None else None
    except yaml.reader.ReaderError as exc:
        line, col = _line_col(text, exc.position)
        raise SpecError(
            f"{source}:{line}: control character #x{exc.character:04x} at column {col}; "
            "study files are plain text: delete it"
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        problem = exc.problem or exc.context or "invalid YAML"
        raise SpecError(f"{source}{line}: YAML syntax error: {problem}") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"{source}: YAML error: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise SpecError(f"{source}: YAML nested too deeply; a study file is a few levels deep") from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, node


def _line_col(text: str, position: int) -> tuple[int, int]:
    before = text[:position]
    return before.count("\n") + 1, position - (before.rfind("\n") + 1) + 1


def loads(text: str, source: str = "<study>") -> Study:
    data, node = _parse(text, source)
    if not isinstance(data, dict):
        raise SpecError(
            f"{source}: a study file is a YAML mapping with keys {', '.join(Study.model_fields)}; "
            f"got {type(data).__name__}"
        )
    # Top-level `x-` keys hold YAML anchors for merge keys (as in docker compose); they are not part
    # of the study, so they never change a hash.
    data = {k: v for k, v in data.items() if not (isinstance(k, str) and k.startswith("x-"))}
    bad = _non_finite(data)
    if bad is not None:
        raise spec_error(source, node, bad, "non-finite number (.inf/.nan); give a finite value")
    try:
        study = Study.model_validate(data)
    except ValidationError as exc:
        loc, msg = describe(exc, Study)
        raise spec_error(source, node, loc, msg) from None
    check_study(study, source, node)
    study._source = source
    study._node = node
    study._text = text
    return study
