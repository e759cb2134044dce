"""Contracts of the repository itself: the README is a short front door whose commands are what CI runs and
whose links reach the manual; shipped studies compile. (The manual itself: tests/test_docs.py.)"""

import re
from pathlib import Path

import pytest
import yaml

from studyrunner.study import load_and_compile

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> tuple[list[str], str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", text, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]
    test_command = re.search(r"Tests: `([^`]+)`", text).group(1)
    return commands, test_command


def test_readme_opens_with_setup_and_quickstart_and_ci_runs_them():
    commands, test_command = readme_commands()
    assert commands == ["./setup.sh", ".venv/bin/studyrunner submit studies/quickstart.yaml"]
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert commands[0] in ci and test_command in ci
    assert ci.index(commands[0]) < ci.index(test_command)


def test_readme_fits_two_screens_and_names_the_manuals_build_command():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    first_lines = "\n".join(text.splitlines()[:15])
    assert ".venv/bin/mkdocs serve" in first_lines and ".venv/bin/mkdocs build" in first_lines
    assert "mkdocs" in (ROOT / "pyproject.toml").read_text()  # the dev extra installs what the command needs


def manual_pages() -> set[str]:
    """Every page in the manual's nav, as a path under docs/."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())

    def walk(node) -> set[str]:
        if isinstance(node, str):
            return {node}
        items = node.values() if isinstance(node, dict) else node
        return set().union(*(walk(item) for item in items))

    return walk(config["nav"])


def test_readme_links_reach_files_and_manual_pages():
    text = (ROOT / "README.md").read_text()
    targets = re.findall(r"\]\(([^)#\s]+)", text)
    assert targets, "the README links nothing"
    pages = manual_pages()
    for target in targets:
        assert not target.startswith(("http://", "https://")), f"README links off the repository: {target}"
        assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
        if target.startswith("docs/") and target.endswith(".md"):
            assert target.removeprefix("docs/") in pages, f"README links to {target}, not a page of the manual"
    linked = {t.removeprefix("docs/") for t in targets}
    for page in ("getting-started.md", "reference/study-file.md", "reference/cli.md", "analysis/index.md"):
        assert page in linked, f"the README does not link the manual's {page}"


@pytest.mark.parametrize(
    "path", sorted((ROOT / "studies").rglob("*.yaml")), ids=lambda p: str(p.relative_to(ROOT / "studies"))
)
def test_shipped_studies_compile(path):
    compiled = load_and_compile(path)
    assert compiled.trials or (compiled.study.search and compiled.bases)  # a search's cells come as it runs


def test_quickstart_compares_looped_with_shallow_and_deeper_unlooped():
    compiled = load_and_compile(ROOT / "studies" / "quickstart.yaml")
    shapes = {
        (c.config["model"]["params"]["block_layers"], c.config["model"]["params"]["loops"]) for c in compiled.cells
    }
    assert shapes == {(1, 1), (1, 4), (4, 1)}
    seeds = compiled.study.seeds  # sequential, small enough to run in minutes: start 2 or 3, max at most 8
    assert seeds.start in (2, 3) and seeds.max <= 8 and compiled.study.claims


def test_shipped_studies_with_claims_take_sequential_seeds():
    from studyrunner.study.seeds import SequentialSeeds

    for path in sorted((ROOT / "studies").glob("**/*.yaml")):
        study = load_and_compile(path).study
        if study.claims and not study.search:
            assert isinstance(study.seeds, SequentialSeeds), path.name


def test_a_shipped_conversion_names_a_trial_its_teacher_study_compiles_to():
    """A teacher is named by trial key (STUDY-CELLHASH-sSEED): a change to the task's or model's defaults moves
    the teacher cell's hash, and the conversion would then find no teacher at submit, after the teacher ran."""
    for conversion in sorted((ROOT / "studies").rglob("*melt_conversion*.yaml")):
        compiled = load_and_compile(conversion)
        named = {t.config["model"]["params"].get("teacher") for t in compiled.trials} - {None}
        teacher_file = conversion.with_name(conversion.name.replace("conversion", "teacher"))
        keys = {t.trial_key for t in load_and_compile(teacher_file).trials}
        assert named and named <= keys, (conversion.name, named - keys)


def _package_imports() -> dict[str, set[str]]:
    """studyrunner's subpackages (and top-level modules) -> the others each imports, lazily or not."""
    import ast

    edges: dict[str, set[str]] = {}
    package = ROOT / "studyrunner"
    for path in package.rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = parts[:-1] if parts[-1] == "__init__" else parts
        here = module[1] if len(module) > 1 else ""
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                package_parts = list(module if path.name == "__init__.py" else module[:-1])
                base = package_parts[: len(package_parts) - (node.level - 1)]
                target = [*base, *(node.module.split(".") if node.module else [])]
            else:
                target = (node.module or "").split(".")
            if target[0] == "studyrunner" and len(target) > 1 and target[1] != here:
                edges.setdefault(here, set()).add(target[1])
    return edges


def test_the_packages_import_one_way():
    """No two of studyrunner's packages import each other, directly or through others (lazy imports count)."""
    edges = _package_imports()

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                todo.extend(edges.get(node, ()))
        return False

    circles = sorted((a, b) for a, targets in edges.items() for b in targets if reaches(b, a))
    assert not circles, circles
    assert "store" in edges["analysis"] and "orchestrate" not in edges["analysis"]  # analysis reads, never runs
    assert not {"orchestrate", "store", "tracking", "cli"} & (edges["train"] | edges["models"] | edges["tasks"])
