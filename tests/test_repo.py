"""Contracts of the repository itself: the README's commands are what CI runs; shipped studies compile."""

import re
from pathlib import Path

import pytest

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
    assert len(compiled.study.seeds) == 2
