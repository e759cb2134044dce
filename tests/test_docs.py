"""The manual cannot rot: it builds strictly, its study-file examples validate, its marked shell examples run,
and its study-file reference lists every field `studyrunner schema` prints.

Conventions the tests read (docs/development.md, "The manual"):
- a ```yaml block is a complete study file, validated by `studyrunner validate`, unless the line before it is
  `<!-- doc-test: partial -->`; a block that is one `--8<-- "PATH"` line is validated as that file;
- a ```bash block after `<!-- doc-test: run -->` is run line by line in a fresh workspace.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from studyrunner.cli import app

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
NOT_PAGES = ("hooks",)  # excluded from the site (mkdocs.yml `exclude_docs`)
FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
MARK = re.compile(r"<!--\s*doc-test:\s*(\w+)\s*-->")
INCLUDE = re.compile(r'^--8<--\s+"([^"]+)"$')
BIN = Path(sys.executable).parent


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    lang: str
    body: str
    mark: str | None  # the `<!-- doc-test: ... -->` right before the fence, if any

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return sorted(p for p in DOCS.rglob("*.md") if p.relative_to(DOCS).parts[0] not in NOT_PAGES)


def blocks(lang: str) -> list[Block]:
    found = []
    for path in pages():
        text = path.read_text()
        for m in FENCE.finditer(text):
            if m.group("lang") != lang:
                continue
            before = [line for line in text[: m.start()].splitlines() if line.strip()]
            mark = MARK.fullmatch(before[-1].strip()) if before else None
            body = "\n".join(line.removeprefix(m.group("indent")) for line in m.group("body").splitlines())
            line = text.count("\n", 0, m.start()) + 1
            found.append(Block(str(path.relative_to(ROOT)), line, lang, body, mark.group(1) if mark else None))
    return found


YAML = blocks("yaml")
STUDY_FILES = [b for b in YAML if b.mark != "partial"]
PARTIAL = [b for b in YAML if b.mark == "partial"]
RUN = [b for b in blocks("bash") if b.mark == "run"]


def validate(path: Path):
    return CliRunner().invoke(app, ["validate", str(path)])


def study_text(block: Block, tmp_path: Path) -> Path:
    """The study file a block shows: the file it includes, or its own text written to a file."""
    include = INCLUDE.match(block.body.strip())
    if include:
        return ROOT / include.group(1)
    path = tmp_path / "example.yaml"
    path.write_text(block.body + "\n")
    return path


# ------------------------------------------------------------------------------------------ the build


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The manual built as the README says, strictly (any warning fails): broken links and anchors, pages
    missing from the nav, a generated part that fails, a docstring mkdocstrings cannot read."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env["NO_MKDOCS_2_WARNING"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    return out


@pytest.mark.e2e
def test_the_manual_builds_strictly_with_every_page(site):
    built = {p.relative_to(site).parent.as_posix() for p in site.rglob("index.html")}
    for page in pages():
        rel = page.relative_to(DOCS).with_suffix("")
        expected = "." if rel.as_posix() == "index" else rel.as_posix().removesuffix("/index")
        assert expected in built, f"{page.relative_to(ROOT)} was not built"


def schema_fields(schema: dict) -> set[str]:
    """Every field of the JSON Schema `studyrunner schema` prints, by its anchor on the reference page:
    the dotted path of a section's field (`train.deepspeed.zero_stage`), `model.FAMILY.PARAM`,
    `task.TASK.PARAM` and `search.space.FORM`. Walked here independently of the page's generator."""
    defs = schema["$defs"]

    def objects(node: dict) -> list[dict]:
        """The object schemas a field may hold (through `$ref`, `anyOf`, `oneOf`)."""
        if "$ref" in node:
            return objects(defs[node["$ref"].rsplit("/", 1)[1]])
        if "properties" in node:
            return [node]
        return [o for option in node.get("anyOf", []) + node.get("oneOf", []) for o in objects(option)]

    def walk(obj: dict, prefix: str) -> set[str]:
        out = set()
        for name, node in obj.get("properties", {}).items():
            out.add(prefix + name)
            if prefix + name in ("model", "task"):
                continue  # their params differ by family and task: below
            for inner in objects(node):
                out |= walk(inner, f"{prefix}{name}.")
            extra = node.get("additionalProperties") or next(
                (o.get("additionalProperties") for o in objects(node) if o.get("additionalProperties")), None
            )
            if isinstance(extra, dict):  # search.space: path -> a range form
                out |= {f"{prefix}{name}.{next(iter(form['properties']))}" for form in objects(extra)}
        return out

    fields = walk(schema, "")
    for section, key in (("model", "family"), ("task", "name")):
        fields |= {f"{section}.{key}", f"{section}.params"}
        for variant in schema["properties"][section]["anyOf"]:
            name = variant["properties"][key]["const"]
            fields |= {f"{section}.{name}.{p}" for p in variant["properties"]["params"]["properties"]}
    return fields


@pytest.mark.e2e
def test_the_study_file_reference_lists_every_field_of_the_schema(site):
    printed = CliRunner().invoke(app, ["schema"])
    assert printed.exit_code == 0, printed.output
    fields = schema_fields(json.loads(printed.stdout))
    assert {"train.steps", "train.deepspeed.zero_stage", "model.looped.loops", "task.phop.hops"} <= fields
    assert len(fields) > 150  # every family's and task's parameters, not just the top level
    page = (site / "reference" / "study-file" / "index.html").read_text()
    anchors = {html.unescape(a) for a in re.findall(r'id="([^"]+)"', page)}
    missing = sorted(fields - anchors)
    assert not missing, f"the study-file reference lacks {len(missing)} fields: {missing[:20]}"


@pytest.mark.e2e
def test_the_command_line_reference_lists_every_verb_and_option(site):
    page = html.unescape(re.sub(r"<[^>]+>", "", (site / "reference" / "cli" / "index.html").read_text()))
    import typer.main

    root = typer.main.get_command(app)
    for name, command in root.commands.items():
        subcommands = getattr(command, "commands", {"": command})
        for sub_name, sub in subcommands.items():
            verb = " ".join(filter(None, ["studyrunner", name, sub_name]))
            assert f"$ {verb} " in page, f"the CLI reference lacks `{verb}`"
            for param in sub.params:
                for opt in param.opts if param.param_type_name == "option" else []:
                    assert opt in page, f"the CLI reference lacks {verb} {opt}"


# ------------------------------------------------------------------------------------- the examples


def test_the_manual_shows_study_files_and_marks_its_snippets():
    included = [b for b in STUDY_FILES if INCLUDE.match(b.body.strip())]
    assert len(STUDY_FILES) - len(included) >= 1 and len(included) >= 8 and len(PARTIAL) >= 5
    assert RUN, "no shell example is marked <!-- doc-test: run -->"


@pytest.mark.parametrize("block", STUDY_FILES, ids=str)
def test_every_study_file_in_the_manual_validates(block, tmp_path):
    result = validate(study_text(block, tmp_path))
    assert result.exit_code == 0, f"{block}: `studyrunner validate` exited {result.exit_code}: {result.output}"


@pytest.mark.parametrize("block", PARTIAL, ids=str)
def test_a_snippet_marked_partial_is_not_a_whole_study_file(block, tmp_path):
    """The mark skips validation, so it may only sit on a part of a file: a complete study file marked
    partial would be an example nobody checks."""
    result = validate(study_text(block, tmp_path))
    assert result.exit_code == 2, f"{block} validates as a whole study file: drop its `partial` mark"


def shell_lines(block: Block) -> list[str]:
    lines = []
    for line in block.body.replace("\\\n", " ").splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()  # a trailing comment (the examples quote no '#')
        if line and not line.startswith("#"):
            lines.append(re.sub(r"^\.venv/bin/", f"{BIN}/", line))
    return lines


@pytest.mark.e2e
@pytest.mark.parametrize("block", RUN, ids=str)
def test_marked_shell_examples_run_in_a_fresh_workspace(block, tmp_path):
    workspace = tmp_path / "ws"
    env = {k: v for k, v in os.environ.items() if k not in ("STUDYRUNNER_DB", "MLFLOW_TRACKING_URI")}
    env |= {
        "STUDYRUNNER_HOME": str(workspace),
        "PATH": os.pathsep.join([str(BIN), env.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]),
    }
    for line in shell_lines(block):
        proc = subprocess.run(["bash", "-c", line], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{block}: `{line}` exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
