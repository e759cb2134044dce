"""MkDocs hook: the manual's generated parts, made from the code at every build so they cannot drift.

A page asks for a generated part with an HTML comment on a line of its own:

    <!-- generated: study-file-reference -->     every field of a study file (the study-file reference)
    <!-- generated: family-params looped -->     one family's own parameters (its page)
    <!-- generated: core-params -->              the shared core's parameters (every family has them)
    <!-- generated: task-params phop -->         one task's parameters
    <!-- generated: cli-reference -->             every verb, argument and option of `studyrunner`

The tables come from `study_json_schema()`, the function `studyrunner schema` prints, so a field added to
the schema, a family or a task appears here with no edit to the manual. The CLI reference is typer's own
Markdown generator (`typer ... utils docs`) run over the app; mkdocs-click cannot read this typer's options
(typer 0.29 carries its own copy of click, whose Option classes are not `click.Option`).
"""

from __future__ import annotations

import functools
import html
import json
import re
from typing import Any

MARKER = re.compile(r"^<!--\s*generated:\s*([a-z-]+)(?:\s+([a-z_]+))?\s*-->$", re.M)


def on_page_markdown(markdown: str, page, config, files) -> str:
    def render(match: re.Match) -> str:
        kind, name = match.group(1), match.group(2)
        renderers = {
            "study-file-reference": lambda: study_file_reference(),
            "family-params": lambda: variant_table("model", name, own_only=True),
            "core-params": lambda: core_table(),
            "task-params": lambda: variant_table("task", name, own_only=False),
            "cli-reference": lambda: cli_reference(),
        }
        if kind not in renderers:
            raise ValueError(f"{page.file.src_path}: unknown generated part {kind!r}")
        return renderers[kind]()

    return MARKER.sub(render, markdown)


# ------------------------------------------------------------------------------------------- the schema


@functools.cache
def schema() -> dict[str, Any]:
    from studyrunner.study.jsonschema import study_json_schema

    return json.loads(json.dumps(study_json_schema()))  # a private copy, as `studyrunner schema` prints it


def resolve(node: dict[str, Any]) -> dict[str, Any]:
    """A field's schema with `$ref` and `anyOf: [X, null]` (an optional field) unwrapped."""
    if "$ref" in node:
        return resolve(schema()["$defs"][node["$ref"].rsplit("/", 1)[1]])
    options = [o for o in node.get("anyOf", []) if o.get("type") != "null"]
    if len(options) == 1 and len(node["anyOf"]) == 2:
        return {**{k: v for k, v in node.items() if k != "anyOf"}, **resolve(options[0])}
    return node


def ref_name(node: dict[str, Any]) -> str | None:
    """The `$defs` entry a field refers to, directly, as an optional field, or as one form of several
    (`seeds`: a list, or the sequential design's section)."""
    refs = [o["$ref"] for o in [node, *node.get("anyOf", []), *node.get("oneOf", [])] if "$ref" in o]
    return refs[0].rsplit("/", 1)[1] if len(refs) == 1 else None


def sections(obj: dict[str, Any], prefix: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every section of a study file below the top level (`train`, `train.deepspeed`, ...), in the schema's
    order, found by walking it: a section added to the schema gets its table with no edit here."""
    out = []
    for name, node in obj.get("properties", {}).items():
        ref = ref_name(node)
        if ref and "properties" in schema()["$defs"][ref]:
            out.append((prefix + name, schema()["$defs"][ref]))
            out += sections(schema()["$defs"][ref], f"{prefix}{name}.")
    return out


def model_at(path: str):
    """The pydantic model of a section, by its dotted path ('' for the study itself)."""
    from typing import get_args

    from pydantic import BaseModel

    from studyrunner.study import Study

    cls = Study
    for part in filter(None, path.split(".")):
        annotation = cls.model_fields[part].annotation
        cls = next(a for a in (annotation, *get_args(annotation)) if isinstance(a, type) and issubclass(a, BaseModel))
    return cls


def variants(section: str) -> dict[str, dict[str, Any]]:
    """{family or task name: its params' object schema}."""
    key = "family" if section == "model" else "name"
    return {v["properties"][key]["const"]: v["properties"]["params"] for v in schema()["properties"][section]["anyOf"]}


# ----------------------------------------------------------------------------------------- formatting


def code(value: Any) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) >= 1000:
        value = int(value)
    text = json.dumps(value) if not isinstance(value, str) or not value else value
    return f"`{text}`"


def number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def type_of(node: dict[str, Any]) -> str:
    node = resolve(node)
    nullable = any(o.get("type") == "null" for o in node.get("anyOf", []))
    if "const" in node:
        return "constant"
    if "anyOf" in node or "oneOf" in node:
        parts = [type_of(o) for o in node.get("anyOf", node.get("oneOf", [])) if o.get("type") != "null"]
        text = " or ".join(dict.fromkeys(parts))
    elif "enum" in node:
        kinds = {type(v).__name__ for v in node["enum"]}
        text = node.get("type") or {"str": "string", "int": "integer", "float": "number"}.get(kinds.pop(), "value")
    elif node.get("type") == "array":
        if "prefixItems" in node:
            text = "[" + ", ".join(type_of(i) for i in node["prefixItems"]) + "]"
        else:
            text = f"list of {type_of(node['items'])}" if node.get("items") else "list"
    elif node.get("type") == "object":
        extra = node.get("additionalProperties")
        text = f"map: key → {type_of(extra)}" if isinstance(extra, dict) and extra else "mapping"
        if "properties" in node and "title" in node:
            text = "section"
    elif isinstance(node.get("type"), list):
        text = " or ".join(node["type"])
    else:
        text = node.get("type", "any")
    return text + (" or unset" if nullable else "")


def default_of(node: dict[str, Any], required: bool, owner: str | None, name: str) -> str:
    """`owner`: the dotted path of the section the field is in ('' at the top level), or None for a family's
    or task's parameters (whose defaults are all in the schema)."""
    if required:
        return "**required**"
    if "default" in node:
        return "unset" if node["default"] is None else code(node["default"])
    # A default made by a factory (a list, a section) is not in the JSON Schema: ask the pydantic model.
    from pydantic import BaseModel

    field = model_at(owner).model_fields[name] if owner is not None else None
    if field is None or field.default_factory is None:
        return ""
    value = field.get_default(call_default_factory=True)
    return "its fields' defaults" if isinstance(value, BaseModel) else code(value)


def allowed_of(node: dict[str, Any]) -> str:
    node = resolve(node)
    parts = []
    if "enum" in node:
        parts.append(", ".join(code(v) for v in node["enum"]))
    if "const" in node:
        parts.append(code(node["const"]))
    low = high = None
    if "minimum" in node or "exclusiveMinimum" in node:
        low = ("[", node["minimum"]) if "minimum" in node else ("(", node["exclusiveMinimum"])
    if "maximum" in node or "exclusiveMaximum" in node:
        high = (node["maximum"], "]") if "maximum" in node else (node["exclusiveMaximum"], ")")
    if low and high:
        parts.append(f"{low[0]}{number(low[1])}, {number(high[0])}{high[1]}")
    elif low:
        parts.append(("≥ " if low[0] == "[" else "> ") + number(low[1]))
    elif high:
        parts.append(("≤ " if high[1] == "]" else "< ") + number(high[0]))
    if "pattern" in node:
        parts.append(f"matches `{node['pattern']}`")
    if "maxLength" in node:
        parts.append(f"at most {node['maxLength']} characters")
    if "minItems" in node and not ("maxItems" in node and node["maxItems"] == node["minItems"]):
        parts.append(f"at least {node['minItems']} item{'s' if node['minItems'] > 1 else ''}")
    if "items" in node and isinstance(node["items"], dict) and "enum" in resolve(node["items"]):
        parts.append("each one of " + ", ".join(code(v) for v in resolve(node["items"])["enum"]))
    if "minProperties" in node:
        parts.append(f"at least {node['minProperties']} entry")
    for option in node.get("anyOf", []):
        sub = allowed_of(option) if option.get("type") != "null" else ""
        if sub:
            parts.append(sub)
    return "; ".join(parts)


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def section_id(path: str) -> str:
    return "section-" + path.replace(".", "-")


def field_rows(
    obj: dict[str, Any], prefix: str, anchor_prefix: str | None, skip=frozenset(), owner: str | None = None
) -> list[str]:
    """One Markdown table row per property of an object schema; each row carries an anchor (the field's
    dotted path) on the reference page, so other pages link to a field and the tests find every one."""
    required = set(obj.get("required", []))
    rows = []
    for name, node in obj.get("properties", {}).items():
        if name in skip:
            continue
        path = f"{prefix}{name}"
        anchor = f'<a id="{anchor_prefix}{name}"></a>' if anchor_prefix is not None else ""
        description = resolve(node).get("description", node.get("description", ""))
        if "properties" in resolve(node) or path in ("model", "task"):
            description = f"{description} See [`{path}`](#{section_id(path)}).".strip()
        rows.append(
            "| "
            + " | ".join(
                [
                    f"{anchor}`{path}`",
                    cell(type_of(node)),
                    default_of(node, name in required, owner, name),
                    cell(allowed_of(node)),
                    cell(description),
                ]
            )
            + " |"
        )
    return rows


HEADER = ["| field | type | default | allowed | what it does |", "|---|---|---|---|---|"]


def table(rows: list[str]) -> str:
    return "\n".join(HEADER + rows) if rows else "(none)"


# ------------------------------------------------------------------------------------- generated parts


def study_file_reference() -> str:
    top = schema()
    out = ["## Top level", "", table(field_rows(top, "", "", owner="")), ""]
    for path, section in sections(top):
        out += [f"## `{path}` {{#{section_id(path)}}}", ""]
        if section.get("description"):
            out += [cell(section["description"]), ""]
        out += [table(field_rows(section, f"{path}.", f"{path}.", owner=path)), ""]
    out += search_space_forms()
    out += variant_reference("model", "family", "Model families")
    out += variant_reference("task", "name", "Tasks")
    return "\n".join(out)


def search_space_forms() -> list[str]:
    domain = schema()["$defs"]["Domain"]
    rows = []
    for form in domain["oneOf"]:
        ((kind, node),) = form["properties"].items()
        exact = node.get("maxItems") == node.get("minItems")
        size = f"exactly {node['maxItems']}" if exact else f"≥ {node['minItems']}"
        anchor = f'<a id="search.space.{kind}"></a>'
        rows.append(f"| {anchor}`{{{kind}: [...]}}` | list of {type_of(node['items'])} | {size} values |")
    return [
        "### The ranges of `search.space`",
        "",
        cell(domain.get("description", "")),
        "",
        "| range | values | how many |",
        "|---|---|---|",
        *rows,
        "",
    ]


def variant_reference(section: str, key: str, title: str) -> list[str]:
    out = [f"## `{section}`: {title.lower()} {{#{section_id(section)}}}", ""]
    names = list(variants(section))
    out += [
        "| field | type | default | allowed | what it does |",
        "|---|---|---|---|---|",
        f'| <a id="{section}.{key}"></a>`{section}.{key}` | string | **required** | '
        + ", ".join(code(n) for n in names)
        + f" | which {'family' if section == 'model' else 'task'}; its parameters are below |",
        f'| <a id="{section}.params"></a>`{section}.params` | mapping | `{{}}` | the fields of the chosen '
        f"{'family' if section == 'model' else 'task'} | parameters; unset ones take the defaults below |",
        "",
    ]
    for name, params in variants(section).items():
        out += [f"### `{name}` {{#{section}-{name}}}", ""]
        if params.get("description"):
            out += [cell(params["description"]), ""]
        out += [table(field_rows(params, f"{section}.params.", f"{section}.{name}.")), ""]
    return out


def variant_table(section: str, name: str | None, own_only: bool) -> str:
    """A family's own parameters (the shared core's left out, unless the family changes a default), or a
    task's parameters, as on the reference page but without anchors."""
    all_variants = variants(section)
    if name not in all_variants:
        raise ValueError(f"no {section} {name!r}; there are {sorted(all_variants)}")
    params = all_variants[name]
    skip: set[str] = set()
    if own_only:
        from studyrunner.models.core import CoreParams

        core = CoreParams.model_json_schema()["properties"]
        skip = {f for f, node in core.items() if params["properties"].get(f) == node}
    return table(field_rows(params, f"{section}.params.", None, frozenset(skip)))


def core_table() -> str:
    from studyrunner.models.core import CoreParams

    core = CoreParams.model_json_schema()
    return table(field_rows(core, "model.params.", None))


def cli_reference() -> str:
    """Every verb of the typer app with its usage, arguments and options (what `--help` prints), as
    Markdown; `<` and `>` outside code are escaped so help text such as `DIR/<study>` stays text."""
    import typer.main
    from typer.cli import get_docs_for_click

    from studyrunner.cli import app

    command = typer.main.get_command(app)
    text = get_docs_for_click(obj=command, ctx=typer.Context(command), name="studyrunner", indent=1)
    lines, fenced = [], False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        if not fenced and not line.startswith("```"):
            parts = line.split("`")
            line = "`".join(html.escape(p, quote=False) if i % 2 == 0 else p for i, p in enumerate(parts))
        lines.append(line)
    return "\n".join(lines)
