"""Bad input and misuse end in one clear line and a non-zero exit, and nothing stored is lost.

Each test names the case of bad input or misuse it reproduces. These need no Ray: the cases that do are in
test_integration.py and test_cli.py.
"""

import json
import re
import textwrap

import numpy as np
import pytest
from conftest import TINY_STUDY
from typer.testing import CliRunner

from studyrunner.cli import app
from studyrunner.errors import SpecError, StudyrunnerError
from studyrunner.study import compile_study, load_and_compile, loads
from studyrunner.tasks.phop import gap_acceptance, hop_answers, sample_phop

runner = CliRunner()


def edited(old: str, new: str, text: str = TINY_STUDY) -> str:
    assert old in text, old
    return text.replace(old, new)


def spec_error(text: str) -> str:
    with pytest.raises(SpecError) as info:
        compile_study(loads(text, source="s.yaml"))
    message = str(info.value)
    assert "\n" not in message
    return message


# --- case 8: non-finite numbers, wherever a number is accepted ------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "where"),
    [
        ("block_layers: 1,", "block_layers: 1, rope_base: .inf,", "s.yaml:4: model.params.rope_base"),
        ("weight_decay: 0.1", "weight_decay: .nan", "s.yaml:5: train.weight_decay"),
        ("model.params.loops: [1, 2]", "model.params.loops: [1, .inf]", "s.yaml:8: grid['model.params.loops'][1]"),
        ("seeds: [0, 1]", "exclude: [{model.params.loops: -.inf}]\nseeds: [0, 1]", "s.yaml:9: exclude[0]"),
    ],
)
def test_non_finite_numbers_are_rejected_by_field(old, new, where):
    message = spec_error(edited(old, new))
    assert message.startswith(where) and "non-finite" in message


# --- case 9 and neighbours: characters and bytes that are not text ---------------------------------


@pytest.mark.parametrize("char", ["\x00", "\x07", "\ufffe"])
def test_control_characters_are_rejected_with_their_line(char):
    text = edited("description: toy", f"description: to{char}y")
    assert re.match(r"s\.yaml:2: control character #x[0-9a-f]{4} at column \d+", spec_error(text))


def test_a_file_that_is_not_utf8_or_not_a_file_is_one_line(tmp_path):
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(SpecError, match="not UTF-8"):
        load_and_compile(bad)
    with pytest.raises(SpecError, match="is a folder"):
        load_and_compile(tmp_path)


# --- case 7: alias expansion is bounded before the document is built --------------------------------


def test_alias_bomb_is_rejected_before_it_is_built():
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]  # 10^9 values
    text = edited("task: {name: phop, params: {alphabet: 4, seq_len: 12, hops: 1}}", "task: {name: phop}")
    bomb = "\n".join(lines) + "\n" + text
    message = spec_error(bomb)
    assert "aliases expand to more than" in message


def test_recursive_alias_is_rejected():
    assert "alias refers to itself" in spec_error(TINY_STUDY + "x: &loop [*loop]\n")


def test_merge_keys_are_supported_and_local_keys_override_them():
    text = textwrap.dedent(
        """\
        name: merged
        x-core: &core {d_model: 16, n_heads: 2, loops: 1}
        task: {name: phop, params: {alphabet: 4, seq_len: 12, hops: 1}}
        model:
          family: looped
          params:
            <<: *core
            loops: 3
        train: {steps: 4}
        """
    )
    params = compile_study(loads(text)).cells[0].config["model"]["params"]
    assert (params["d_model"], params["n_heads"], params["loops"]) == (16, 2, 3)
    dup = text.replace("loops: 3", "loops: 3\n    loops: 4")
    assert "duplicate key 'loops'" in spec_error(dup)
    assert "unknown key" in spec_error(text.replace("x-core", "core"))  # only x- keys hold anchors


def test_x_keys_do_not_change_hashes():
    plain = compile_study(loads(TINY_STUDY))
    with_x = compile_study(loads("x-notes: {anything: [1, 2]}\n" + TINY_STUDY))
    assert [t.trial_key for t in plain.trials] == [t.trial_key for t in with_x.trials]


# --- case 10: seeds within what the ledger and torch accept -----------------------------------------


@pytest.mark.parametrize("seed", [2**63, 2**31, -1])
def test_out_of_range_seeds_are_rejected(seed):
    assert "seeds" in spec_error(edited("seeds: [0, 1]", f"seeds: [{seed}]"))


def test_largest_seed_is_accepted():
    assert compile_study(loads(edited("seeds: [0, 1]", f"seeds: [{2**31 - 1}]"))).trials


# --- case 16: strict types ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("loops: 1}", 'loops: "4"}', "model.params.loops"),
        ("loops: 1}", "loops: 1, bias: yes}", "model.params.bias"),  # YAML 1.2: `yes` is a string
        ("loops: 1}", "loops: 1, bias: on}", "model.params.bias"),
        ("loops: 1}", "loops: 1, bias: 1}", "model.params.bias"),
        ("loops: 1}", 'loops: 1, bias: "yes"}', "model.params.bias"),
        ("hops: 1}", "hops: true}", "task.params.hops"),
        ("seeds: [0, 1]", "seeds: [true, false]", "seeds[0]"),
        ("seeds: [0, 1]", 'seeds: ["3"]', "seeds[0]"),
        ("steps: 12", 'steps: "12"', "train.steps"),
        ("lr: 1.0e-3", 'lr: "0.001"', "train.lr"),
        ("model.params.loops: [1, 2]", 'model.params.loops: [1, "2"]', "model.params.loops"),
        ("cpu: 1", "cpu: true", "resources.cpu"),
    ],
)
def test_strings_and_booleans_are_not_numbers(old, new, field):
    message = spec_error(edited(old, new))
    assert field in message


def test_addition_reverse_answer_off_is_not_a_boolean():
    text = edited(
        "task: {name: phop, params: {alphabet: 4, seq_len: 12, hops: 1}}",
        'task: {name: addition, params: {digits: 2, reverse_answer: "off"}}',
    )
    assert "task.params.reverse_answer" in spec_error(text)


def test_integral_floats_stay_accepted_for_ints_and_hash_like_ints():
    as_float = compile_study(loads(edited("steps: 12", "steps: 1.2e1")))
    as_int = compile_study(loads(TINY_STUDY))
    assert [t.trial_key for t in as_float.trials] == [t.trial_key for t in as_int.trials]
    assert "train.steps" in spec_error(edited("steps: 12", "steps: 12.5"))


def test_the_json_schema_and_the_loader_agree_on_a_quoted_number():
    from studyrunner.study.jsonschema import study_json_schema

    looped = next(
        v for v in study_json_schema()["properties"]["model"]["anyOf"] if v["properties"]["family"]["const"] == "looped"
    )
    assert looped["properties"]["params"]["properties"]["loops"]["type"] == "integer"
    spec_error(edited("loops: 1}", 'loops: "4"}'))


# --- case 15: cross-field errors name the entry and its line ------------------------------------------


def test_exclude_with_an_unknown_path_names_it_and_its_line():
    text = edited("seeds: [0, 1]", "exclude:\n  - {model.params.loops: 1}\n  - {model.params.nope: 1}\nseeds: [0, 1]")
    message = spec_error(text)
    assert message.startswith("s.yaml:11: exclude[1]['model.params.nope']: no grid or zip axis varies")


def test_a_path_in_grid_and_zip_names_the_zip_entry():
    text = edited("seeds: [0, 1]", "zip:\n  - {model.params.loops: [1, 2]}\nseeds: [0, 1]")
    assert spec_error(text).startswith("s.yaml:10: zip[0]['model.params.loops']: path is varied twice")


def test_unequal_zip_lists_are_reported_once():
    text = edited("seeds: [0, 1]", "zip:\n  - {model.params.d_model: [16, 32], train.lr: [0.001]}\nseeds: [0, 1]")
    message = spec_error(text)
    assert message.startswith("s.yaml:10: zip[0]: value lists must be non-empty and of equal length")
    assert message.count("got") == 0 and message.count("model.params.d_model") == 1


# --- case 4: every accepted p-hop setting generates in bounded time -----------------------------------


@pytest.mark.parametrize(("n", "p"), [(62, 30), (12, 5), (40, 19), (32, 2), (200, 60)])
def test_phop_generates_for_tight_settings_that_validate_accepts(n, p):
    loads(edited("seq_len: 12, hops: 1", f"seq_len: {n}, hops: {p}"))  # accepted by validate
    v, answers = sample_phop(np.random.default_rng(0), 64, 4, n, p)
    assert v.shape == (64, n)
    assert np.array_equal(hop_answers(v, p), answers)


def test_phop_keeps_the_rejection_sampler_where_it_works():
    # The quickstart's setting keeps its exact data stream (and so its published metrics).
    assert gap_acceptance(32, 2) > 0.5
    assert gap_acceptance(62, 30) < 1e-6


# --- case 18: the impossible is rejected, the suspicious warned about ----------------------------------


def test_eval_examples_that_cannot_fit_in_memory_are_rejected():
    assert "eval.examples" in spec_error(edited("examples: 32", "examples: 1e12"))
    long = edited("seq_len: 12, hops: 1", "seq_len: 8192, hops: 1")
    message = spec_error(edited("examples: 32", "examples: 1000000", long))
    assert "eval tokens" in message and "eval.examples" in message


def test_more_eval_examples_than_distinct_problems_is_a_warning():
    text = edited(
        "task: {name: phop, params: {alphabet: 4, seq_len: 12, hops: 1}}",
        "task: {name: addition, params: {digits: 2}}",
    )
    compiled = compile_study(loads(edited("examples: 32", "examples: 100000", text)))
    assert any("distinct eval" in w and "eval.examples" in w for w in compiled.warnings)


def test_an_exclude_entry_that_matches_no_cell_is_a_warning():
    compiled = compile_study(loads(edited("seeds: [0, 1]", "exclude: [{model.params.loops: 3}]\nseeds: [0, 1]")))
    assert len(compiled.cells) == 2
    assert compiled.warnings == [compiled.warnings[0]] and "exclude[0]: matches no cell" in compiled.warnings[0]


def test_a_metric_no_trial_reports_is_rejected_and_the_reported_ones_are_listed():
    message = spec_error(edited("name: eval_accuracy", "name: eval_acuracy"))
    assert message.startswith("s.yaml:") and "metric.name" in message and "eval_accuracy" in message


def test_a_study_larger_than_the_limit_is_rejected_before_it_is_expanded():
    text = edited(
        "model.params.loops: [1, 2]",
        "model.params.loops: [" + ", ".join(map(str, range(1, 101))) + "]\n"
        "  model.params.d_model: [" + ", ".join(str(8 * i) for i in range(1, 101)) + "]\n"
        "  train.lr: [" + ", ".join(f"0.{i:03d}" for i in range(1, 101)) + "]",
    )
    assert "a study holds at most" in spec_error(text)


# --- case 17: unsuffixed eval metrics exist with one split -------------------------------------------


def test_addition_with_one_eval_split_accepts_and_reports_the_unsuffixed_metric():
    import torch

    from studyrunner.train import run_trial

    text = edited(
        "task: {name: phop, params: {alphabet: 4, seq_len: 12, hops: 1}}",
        "task: {name: addition, params: {digits: 2, eval_operands: [2]}}",
    )
    compiled = compile_study(loads(edited("name: eval_accuracy", "name: eval_exact_match", text)))
    torch.set_num_threads(1)
    final = run_trial(compiled.cells[0].config, seed=0)
    assert "eval_exact_match" in final and "eval_exact_match_n2" in final
    assert final["eval_exact_match"] == final["eval_exact_match_n2"]


# --- case 14: user text and schema text print literally ------------------------------------------------


def test_markup_in_messages_prints_literally(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(edited("name: tiny", 'name: "[bold red]x"'))
    result = runner.invoke(app, ["validate", str(path)])
    assert result.exit_code == 2
    assert "^[a-z0-9_-]+$" in result.output and "[bold red]x" in result.output


# --- case 3, 11, 13 and neighbours: CLI paths that end in one line ---------------------------------------


def test_read_only_commands_create_nothing_and_say_no_ledger_is_there(tmp_path):
    missing = tmp_path / "typo"
    for args in (["status"], ["results", "tiny"]):
        result = runner.invoke(app, [*args, "--workspace", str(missing)])
        assert result.exit_code == 1 and "no results ledger" in result.output
    other_db = f"sqlite:///{tmp_path / 'nope' / 'ledger.db'}"
    assert runner.invoke(app, ["status", "--db", other_db]).exit_code == 1
    assert not missing.exists() and not (tmp_path / "nope").exists()


def test_a_workspace_that_is_a_file_is_one_line(tmp_path):
    file = tmp_path / "file"
    file.write_text("x")
    result = runner.invoke(app, ["status", "--workspace", str(file)])
    assert result.exit_code == 1 and "is a file, not a folder" in result.output


@pytest.mark.parametrize(
    ("db", "says"),
    [
        ("mysql://u@localhost/x", "driver is not installed"),
        ("sqlite:///", "in-memory"),
        ("sqlite://", "in-memory"),
        ("sqlite:///:memory:", "in-memory"),
        ("nodb://x", "not a database URL"),
    ],
)
def test_bad_database_urls_are_one_line(tmp_path, db, says):
    result = runner.invoke(app, ["status", "--db", db])
    assert result.exit_code == 1 and says in result.output and "Traceback" not in result.output


def test_in_memory_tracking_store_is_rejected_before_anything_is_written(tmp_path):
    study = tmp_path / "s.yaml"
    study.write_text(TINY_STUDY)
    ws = tmp_path / "ws"
    result = runner.invoke(app, ["submit", str(study), "--workspace", str(ws), "--tracking-uri", "sqlite:///"])
    assert result.exit_code == 1 and "in-memory" in result.output
    assert not ws.exists()


def test_unknown_storage_scheme_is_rejected_before_anything_is_written(tmp_path):
    study = tmp_path / "s.yaml"
    study.write_text(TINY_STUDY)
    ws = tmp_path / "ws"
    result = runner.invoke(app, ["submit", str(study), "--workspace", str(ws), "--storage", "foo://bar"])
    assert result.exit_code == 1 and "--storage" in result.output and "foo://bar" in result.output
    assert not ws.exists()  # no ledger, no MLflow experiment with a broken artifact location


def test_unreachable_tracking_server_fails_in_seconds(tmp_path):
    study = tmp_path / "s.yaml"
    study.write_text(TINY_STUDY)
    args = ["submit", str(study), "--workspace", str(tmp_path / "ws"), "--tracking-uri", "http://127.0.0.1:1"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "cannot reach MLflow tracking server" in result.output


@pytest.fixture
def ledger_with_a_study(tmp_path):
    from studyrunner.store import Ledger

    ledger = Ledger(f"sqlite:///{tmp_path / 'ws' / 'ledger.db'}")
    compiled = compile_study(loads(TINY_STUDY))
    ledger.register(compiled)
    for trial in compiled.trials:
        ledger.mark_running(trial.trial_key)
        ledger.mark_succeeded(trial.trial_key, {"eval_accuracy": 0.5})
    return tmp_path / "ws"


@pytest.mark.parametrize("target", ["folder", "missing/out.csv"])
def test_results_out_to_a_folder_or_missing_folder_is_one_line(ledger_with_a_study, tmp_path, target):
    out = tmp_path / target if target != "folder" else tmp_path
    result = runner.invoke(
        app, ["results", "tiny", "--workspace", str(ledger_with_a_study), "-f", "csv", "--out", str(out)]
    )
    assert result.exit_code == 1 and result.output.startswith("error: --out:")


def test_results_table_out_writes_the_table(ledger_with_a_study, tmp_path):
    out = tmp_path / "t.txt"
    result = runner.invoke(app, ["results", "tiny", "--workspace", str(ledger_with_a_study), "--out", str(out)])
    assert result.exit_code == 0 and "wrote 4 rows" in result.output
    text = out.read_text()
    assert "eval_accuracy" in text and text.count("succeeded") == 4 and "\x1b[" not in text


def test_json_timestamps_carry_their_timezone(ledger_with_a_study):
    result = runner.invoke(app, ["results", "tiny", "--workspace", str(ledger_with_a_study), "-f", "json"])
    rows = json.loads(result.stdout)
    assert rows[0]["started_at"].endswith(("+00:00", "Z"))


def test_version():
    from studyrunner import __version__

    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and __version__ in result.output


def test_an_unexpected_error_is_one_line_with_a_debug_hint(monkeypatch, tmp_path):
    import studyrunner.study as spec

    def boom(_path):
        raise RuntimeError("something broke\nsecond line")

    monkeypatch.setattr(spec, "load_and_compile", boom)  # fault injection: a bug inside a command
    result = runner.invoke(app, ["validate", str(tmp_path / "x.yaml")])
    assert result.exit_code == 1
    assert (
        result.output.strip()
        == "error: RuntimeError: something broke (unexpected; STUDYRUNNER_DEBUG=1 shows the traceback)"
    )


def test_studyrunner_error_is_a_one_line_exit_code():
    assert StudyrunnerError.exit_code == 1 and SpecError.exit_code == 2


# --- case 5: resources no node has (the Ray end to end is in test_integration.py) ----------------------


def test_cluster_capacity_check_names_the_resource_and_the_largest_node():
    from studyrunner.orchestrate.cluster.capacity import check_cluster_fits
    from studyrunner.study.schema import Resources

    nodes = [
        {"Alive": True, "Resources": {"CPU": 2.0, "memory": 8 * 1024**3}},
        {"Alive": False, "Resources": {"CPU": 64.0, "GPU": 8.0}},  # dead nodes do not count
    ]
    check_cluster_fits(Resources(cpu=2), nodes)
    with pytest.raises(StudyrunnerError, match=r"asks for 1 GPU per trial \(resources.gpu\); .* has 0"):
        check_cluster_fits(Resources(cpu=1, gpu=1), nodes)
    with pytest.raises(StudyrunnerError, match=r"asks for 16 GB of memory per trial \(resources.memory_gb\)"):
        check_cluster_fits(Resources(cpu=1, memory_gb=16), nodes)
    two = [{"Resources": {"CPU": 8.0}}, {"Resources": {"GPU": 1.0, "CPU": 1.0}}]
    with pytest.raises(StudyrunnerError, match="no single node"):
        check_cluster_fits(Resources(cpu=4, gpu=1), two)


@pytest.mark.skipif(not __import__("os").path.exists("/proc/version"), reason="needs Linux /proc")
def test_results_out_to_an_unwritable_file_is_one_line(ledger_with_a_study):
    args = ["results", "tiny", "--workspace", str(ledger_with_a_study), "-f", "csv", "--out", "/proc/version"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and result.output.startswith("error: --out: cannot write '/proc/version'")


def test_test_time_depth_metrics_count_as_reported_and_take_integral_floats():
    text = edited("name: eval_accuracy", "name: eval_accuracy_loops_8").replace(
        "eval: {every: 6, examples: 32}", "eval: {every: 6, examples: 32, loops: [2.0, 8]}"
    )
    compiled = compile_study(loads(text))
    assert compiled.cells[0].config["eval"]["loops"] == [2, 8]
    assert "no trial of this study reports 'eval_accuracy_loops_3'" in spec_error(
        text.replace("name: eval_accuracy_loops_8", "name: eval_accuracy_loops_3")
    )
