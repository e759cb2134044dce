"""`studyrunner tasks`: every registered task with its options, metric levels and measured train/eval overlap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from studyrunner.cli import app
from studyrunner.tasks import TASKS, get_task
from studyrunner.tasks.overlap import measure_overlap, sampled_overlap

runner = CliRunner()
STUDIES = Path(__file__).parents[1] / "studies"


def invoke(*args: str):
    return runner.invoke(app, ["tasks", *args])


@pytest.fixture(scope="module")
def listed() -> list[dict]:
    result = invoke("--format", "json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_lists_every_registered_task_with_options_metrics_and_overlap(listed):
    assert [entry["name"] for entry in listed] == list(TASKS)
    for entry in listed:
        assert {"name", "options", "metrics", "overlap"} <= set(entry), entry["name"]
        model = get_task(entry["name"]).params_model
        assert [o["name"] for o in entry["options"]] == list(model.model_fields)
        for option in entry["options"]:
            assert {"name", "type", "default", "description"} <= set(option)
            assert option["type"] and option["description"], (entry["name"], option)
        assert "eval_accuracy" in entry["metrics"] and "eval_loss" in entry["metrics"]
        for metric, levels in entry["metrics"].items():
            assert set(levels) - {"scale"} == {"range", "better", "chance", "floor", "floor_strategy"}, metric
            assert levels.get("scale", "log") == "log"  # only a log-scale metric (perplexity) says its scale
            assert levels["better"] in ("higher", "lower")
            low, high = levels["range"]
            assert low is not None and (high is None or high >= low)  # JSON has no infinity: null
            if levels["floor"] is not None:
                assert levels["floor_strategy"], (entry["name"], metric)
        assert entry["overlap"], entry["name"]
        for split, overlap in entry["overlap"].items():
            assert 0 <= overlap["share"] <= 1 and overlap["method"], (entry["name"], split)


def test_json_options_carry_the_params_model_defaults_and_types(listed):
    phop = next(entry for entry in listed if entry["name"] == "phop")
    options = {o["name"]: o for o in phop["options"]}
    assert options["hops"]["type"] == "int" and options["hops"]["default"] == 2
    assert options["hops"]["bounds"] == {"ge": 1, "le": 1024}
    igsm = next(entry for entry in listed if entry["name"] == "igsm")
    min_ops = {o["name"]: o for o in igsm["options"]}["min_ops"]
    assert min_ops["default"] == 0 and "copy chains" in min_ops["description"]
    assert phop["overlap"][""]["exact"] and "sampled" in phop["overlap"][""]  # the exact figure, the sample beside


def test_the_table_shows_options_levels_and_overlap():
    result = invoke("igsm", "--param", "nodes=4", "--param", "max_terms=2")
    assert result.exit_code == 0, result.output
    text = result.stdout
    for fragment in ("igsm: options", "min_ops", "eval_accuracy", "copy chain", "overlap (eval set): 0.0%"):
        assert fragment in text, fragment


def test_param_moves_the_levels_igsm_min_ops_removes_the_copy_floor():
    shipped = json.loads(invoke("igsm", "-p", "nodes=4", "-p", "max_terms=2", "-f", "json").stdout)[0]
    deep = json.loads(invoke("igsm", "-p", "nodes=4", "-p", "max_terms=2", "-p", "min_ops=2", "-f", "json").stdout)[0]
    assert shipped["params"]["nodes"] == 4 and deep["params"]["min_ops"] == 2
    assert shipped["metrics"]["eval_accuracy"]["floor"] > 0.4  # copy and guess
    assert deep["metrics"]["eval_accuracy"]["floor"] is None
    assert deep["metrics"]["eval_accuracy"]["chance"] == pytest.approx(1 / 7)


def _shipped_settings() -> list[tuple[str, dict, int]]:
    """(task, params, eval examples) of every study shipped in studies/*.yaml, each setting once."""
    seen: dict[str, tuple[str, dict, int]] = {}
    for path in sorted(STUDIES.glob("*.yaml")):
        study = yaml.safe_load(path.read_text())
        task = study["task"]
        examples = int((study.get("eval") or {}).get("examples") or 512)
        key = json.dumps([task["name"], task.get("params") or {}, examples], sort_keys=True)
        seen.setdefault(key, (task["name"], task.get("params") or {}, examples))
    return list(seen.values())


@pytest.mark.parametrize("name,params,examples", _shipped_settings(), ids=lambda v: v if isinstance(v, str) else None)
def test_no_eval_example_of_a_shipped_study_occurs_in_training(name, params, examples):
    args = [name, "--format", "json", "--examples", str(examples)]
    for key, value in params.items():
        args += ["--param", f"{key}={json.dumps(value)}"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.stdout)
    for split, overlap in entry["overlap"].items():
        assert overlap["share"] == 0.0, (name, params, split, overlap)
        assert overlap.get("sampled", overlap)["share"] == 0.0


def test_shipped_studies_cover_the_looped_depth_tasks():
    names = {name for name, _, _ in _shipped_settings()}
    assert {"phop", "igsm", "addition", "sudoku"} <= names


def test_the_sample_finds_overlap_where_there_is_some():
    """The measurement is not vacuous: on a task whose example space is tiny, the training sample contains eval
    sequences of a task that does not hold out (a fake one: the eval set is the first training batch)."""
    from studyrunner.tasks import build_task

    task = build_task("phop", {"alphabet": 4, "seq_len": 12, "hops": 1}, seed=0)
    leaky = type(
        "Leaky", (), {"train_batch": task.train_batch, "eval_sets": lambda self, n: {"": task.train_batch(3, n)}}
    )
    found = sampled_overlap(leaky(), examples=64, batches=5, batch_size=64)[""]
    assert found.share == 1.0 and found.seen == 64 and not found.exact
    measured = measure_overlap(task, examples=64, batches=5, batch_size=64)[""]
    assert measured["exact"].share == 0.0 and measured["sampled"].share == 0.0


def test_an_unknown_task_is_one_line_naming_the_known_ones():
    result = invoke("nope")
    assert result.exit_code != 0
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1, message
    assert "unknown task 'nope'" in message and all(name in message for name in TASKS), message


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["phop", "--param", "hops=999"], "task phop: a 999-hop chain needs seq_len >= 2000"),
        (["phop", "--param", "bogus=1"], "bogus"),
        (["phop", "--param", "hops"], "expected NAME=VALUE"),
        (["--param", "hops=4"], "needs a task NAME"),
        (["igsm", "--param", "min_ops=9", "--param", "nodes=4"], "min_ops"),
    ],
)
def test_bad_params_are_one_line(args, fragment):
    result = invoke(*args)
    assert result.exit_code != 0
    message = result.stderr.strip()
    assert len(message.splitlines()) == 1 and fragment in message, message
