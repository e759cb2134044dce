"""Study files: loading, validation errors, compilation and hashing."""

import json

import pytest
from conftest import TINY_STUDY
from typer.testing import CliRunner

from studyrunner.cli import app
from studyrunner.errors import SpecError
from studyrunner.study import compile_study, load, loads
from studyrunner.study.jsonschema import study_json_schema

# The same study as TINY_STUDY, written differently: key order, block style, number formatting.
TINY_RESTYLED = """\
seeds: [1, 0]
metric: {mode: max, name: eval_accuracy}
grid:
  model.params.loops:
    - 1
    - 2.0e0
model:
  params: {loops: 1, block_layers: 1, n_heads: 2, d_model: 16}
  family: looped
resources: {gpu: 0, cpu: 1}
name: tiny
description: "toy looped vs unlooped"
train:
  grad_clip: 1
  weight_decay: 0.10
  warmup_steps: 2
  lr: 0.001
  batch_size: 16
  steps: 12
  log_every: 4
task:
  params: {hops: 1, seq_len: 12, alphabet: 4}
  name: phop
eval: {examples: 32, every: 6}
"""


def keys(text):
    return sorted(t.trial_key for t in compile_study(loads(text)).trials)


def test_compile_counts_cells_and_trials():
    compiled = compile_study(loads(TINY_STUDY))
    assert len(compiled.cells) == 2
    assert len(compiled.trials) == 4
    assert [c.overrides for c in compiled.cells] == [{"model.params.loops": 1}, {"model.params.loops": 2}]
    loops = {t.config["model"]["params"]["loops"] for t in compiled.trials}
    assert loops == {1, 2}


def test_hashes_ignore_key_order_number_format_and_yaml_style():
    assert keys(TINY_STUDY) == keys(TINY_RESTYLED)


def test_hashes_are_stable_across_processes():
    # A literal value pins the canonical form: a change here invalidates every stored trial key.
    compiled = compile_study(loads(TINY_STUDY))
    assert compiled.trials[0].trial_key.startswith("tiny-")
    assert compiled.trials[0].trial_key.endswith("-s0")
    again = compile_study(loads(TINY_STUDY))
    assert [t.trial_key for t in compiled.trials] == [t.trial_key for t in again.trials]


def test_trial_key_depends_on_seed_study_and_config_but_cell_hash_not_on_seed():
    compiled = compile_study(loads(TINY_STUDY))
    by_cell = {}
    for t in compiled.trials:
        by_cell.setdefault(t.cell_hash, set()).add(t.trial_key)
    assert all(len(v) == 2 for v in by_cell.values())
    renamed = keys(TINY_STUDY.replace("name: tiny", "name: tiny2"))
    assert set(renamed).isdisjoint(keys(TINY_STUDY))
    changed = keys(TINY_STUDY.replace("steps: 12", "steps: 13"))
    assert set(changed).isdisjoint(keys(TINY_STUDY))


def test_defaults_are_resolved_into_the_hash():
    explicit = TINY_STUDY.replace("d_model: 16,", "d_model: 16, mlp_ratio: 4,")
    assert keys(explicit) == keys(TINY_STUDY)


def test_zip_and_exclude():
    text = TINY_STUDY.replace(
        "grid:\n  model.params.loops: [1, 2]\n",
        "grid:\n  train.lr: [1.0e-3, 2.0e-3]\n"
        "zip:\n  - {model.params.block_layers: [1, 1, 4], model.params.loops: [1, 4, 1]}\n"
        "exclude:\n  - {train.lr: 2.0e-3, model.params.block_layers: 4}\n",
    )
    compiled = compile_study(loads(text))
    shapes = [
        (c.config["train"]["lr"], c.config["model"]["params"]["block_layers"], c.config["model"]["params"]["loops"])
        for c in compiled.cells
    ]
    assert shapes == [(1e-3, 1, 1), (1e-3, 1, 4), (1e-3, 4, 1), (2e-3, 1, 1), (2e-3, 1, 4)]
    assert len({c.cell_hash for c in compiled.cells}) == 5


def test_loaded_study_keeps_its_text_for_artifacts(write_study):
    path = write_study(TINY_STUDY)
    assert load(path).text == TINY_STUDY


BAD = [
    # (what, replace this, with this, expected substrings)
    ("yaml syntax", "seeds: [0, 1]", "seeds: [0, 1", ["YAML syntax error", "study.yaml:"]),
    ("unknown top-level key", "seeds: [0, 1]", "seeds: [0, 1]\nsedes: [2]", ["sedes", "unknown key", "valid keys"]),
    ("unknown train key", "grad_clip: 1.0", "grad_clip: 1.0, grad_clipp: 1", ["train.grad_clipp", "unknown key"]),
    ("wrong type", "steps: 12", "steps: many", ["train.steps", "integer"]),
    ("out of range", "lr: 1.0e-3", "lr: -1.0", ["train.lr", "greater than 0"]),
    ("family param it lacks", "loops: 1}}", "loops: 1, loopz: 3}}", ["model.params.loopz", "unknown key", "loops"]),
    (
        "grid value out of range",
        "model.params.loops: [1, 2]",
        "model.params.loops: [1, 0]",
        ["grid['model.params.loops'][1]", "greater than or equal to 1"],
    ),
    (
        "grid path the family lacks",
        "model.params.loops: [1, 2]",
        "model.params.layers: [1, 2]",
        ["grid['model.params.layers']", "unknown key"],
    ),
    ("empty grid axis", "model.params.loops: [1, 2]", "model.params.loops: []", ["grid", "no values"]),
    ("grid path outside the config", "model.params.loops: [1, 2]", "seeds.x: [1]", ["not a dotted path"]),
    ("unknown family", "family: looped", "family: loopd", ["model.family", "unknown model family", "looped"]),
    ("unknown task", "name: phop", "name: phopp", ["task.name", "unknown task", "phop"]),
    ("duplicate key", "seeds: [0, 1]", "seeds: [0, 1]\nseeds: [2]", ["duplicate key 'seeds'"]),
    ("bad study name", "name: tiny", "name: Tiny Study", ["name", "pattern"]),
    ("metric mode", "mode: max", "mode: maximum", ["metric.mode", "'max' or 'min'"]),
    ("warmup too long", "warmup_steps: 2", "warmup_steps: 12", ["train", "warmup_steps (12)"]),
    (
        "zip lengths",
        "grid:\n  model.params.loops: [1, 2]",
        "zip:\n  - {model.params.loops: [1, 2], train.lr: [0.1]}",
        ["zip", "equal length"],
    ),
    ("task param out of range", "hops: 1}", "hops: 0}", ["task.params.hops", "greater than or equal to 1"]),
]


@pytest.mark.parametrize("what,old,new,expected", BAD, ids=[b[0] for b in BAD])
def test_bad_study_files_exit_2_with_one_line_naming_the_field(write_study, what, old, new, expected):
    assert old in TINY_STUDY
    path = write_study(TINY_STUDY.replace(old, new, 1))
    with pytest.raises(SpecError) as info:
        compile_study(load(path))
    message = str(info.value)
    assert message.startswith(str(path)), message
    for part in expected:
        assert part in message, message
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1, result.output


def test_error_points_at_the_yaml_line(write_study):
    path = write_study(TINY_STUDY.replace("loops: 1}}", "loops: 1, loopz: 3}}"))
    with pytest.raises(SpecError, match=r"study\.yaml:4: model\.params\.loopz"):
        compile_study(load(path))


def test_study_files_cannot_execute_code(write_study):
    path = write_study(
        TINY_STUDY.replace(
            "description: toy looped vs unlooped", "description: !!python/object/apply:os.system ['echo hi']"
        )
    )
    with pytest.raises(SpecError, match="YAML"):
        load(path)


def test_missing_file_is_a_clear_error(tmp_path):
    result = CliRunner().invoke(app, ["validate", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "no such file" in result.output


def test_json_schema_lists_families_and_tasks():
    schema = study_json_schema()
    json.dumps(schema)
    families = [v["properties"]["family"]["const"] for v in schema["properties"]["model"]["anyOf"]]
    tasks = [v["properties"]["name"]["const"] for v in schema["properties"]["task"]["anyOf"]]
    assert "looped" in families
    assert {"phop", "addition"} <= set(tasks)
    looped = next(v for v in schema["properties"]["model"]["anyOf"] if v["properties"]["family"]["const"] == "looped")
    assert {"loops", "block_layers", "d_model"} <= set(looped["properties"]["params"]["properties"])


def test_checkpoint_interval_does_not_change_hashes():
    with_checkpoints = keys(TINY_STUDY.replace("log_every: 4}", "log_every: 4, checkpoint_every: 5}"))
    assert with_checkpoints == keys(TINY_STUDY)
