"""Matched baselines (`baselines: [iso_param, iso_flop]`): which cells they add, and how they are stored."""

import pytest
import torch
from conftest import TINY_STUDY

from studyrunner.errors import SpecError
from studyrunner.models import build_model, count_params
from studyrunner.results import trials_frame
from studyrunner.store import Ledger
from studyrunner.study import compile_study, loads
from studyrunner.tasks import build_task

LOOPED = TINY_STUDY.replace("model.params.loops: [1, 2]", "model.params.loops: [1, 2, 4]")


def with_baselines(text_: str, kinds: str = "[iso_param, iso_flop]") -> str:
    return text_.replace("seeds: [0, 1]", f"baselines: {kinds}\nseeds: [0, 1]")


def params_of(cell) -> int:
    task = build_task(cell.config["task"]["name"], cell.config["task"]["params"], seed=0)
    with torch.device("meta"):
        return count_params(build_model(cell.config["model"]["family"], cell.config["model"]["params"], task.facts))


def test_looped_baselines_are_k_by_1_and_kl_by_1_and_shared_ones_run_once():
    plain = compile_study(loads(LOOPED))
    compiled = compile_study(loads(with_baselines(LOOPED)))
    by_label = {c.label: c for c in compiled.cells}
    loops = {c.config["model"]["params"]["loops"]: c for c in plain.cells}
    # The existing cells keep their hashes; loops=1 *is* the iso-param baseline of loops=2 and loops=4.
    assert [c.cell_hash for c in compiled.cells[:3]] == [c.cell_hash for c in plain.cells]
    assert by_label["loops=1"].baseline_of == (("iso_param", loops[2].cell_hash), ("iso_param", loops[4].cell_hash))
    for n in (2, 4):
        flop = by_label[f"iso_flop of loops={n}"]
        assert flop.baseline_of == (("iso_flop", loops[n].cell_hash),)
        assert flop.config["model"]["params"]["block_layers"] == n and flop.config["model"]["params"]["loops"] == 1
    assert len(compiled.cells) == 5 and len(compiled.trials) == 10


def test_iso_param_baselines_match_parameters_within_one_percent():
    study = TINY_STUDY.replace(
        "task: {name: phop, params: {alphabet: 4, seq_len: 12, hops: 1}}", "task: {name: sudoku, params: {size: 4}}"
    ).replace("metric: {name: eval_accuracy, mode: max}", "metric: {name: eval_exact_match, mode: max}")
    families = {
        "ut_act": "{family: ut_act, params: {d_model: 32, n_heads: 2, loops: 8, memory_slots: 4, norm: layernorm}}",
        "adaptive_layers": "{family: adaptive_layers, params: {d_model: 32, n_heads: 2, n_layers: 2, loops: 3, "
        "memory_slots: 8, memory_global_slots: 4}}",
    }
    for family, model in families.items():
        text_ = study.replace(
            "{family: looped, params: {d_model: 16, n_heads: 2, block_layers: 1, loops: 1}}", model
        ).replace("  model.params.loops: [1, 2]\n", "  model.params.d_model: [32, 64]\n")
        compiled = compile_study(loads(with_baselines(text_, "[iso_param]")))
        looped = {c.cell_hash: c for c in compiled.cells if not c.baseline_of}
        baselines = [c for c in compiled.cells if c.baseline_of]
        assert len(baselines) == 2, family
        for base in baselines:
            ((kind, of),) = base.baseline_of
            target = params_of(looped[of])
            assert kind == "iso_param" and abs(params_of(base) - target) <= 0.01 * target, (family, base.label)
            assert base.config["model"]["params"]["loops"] == 1


def test_a_ponder_weight_is_dropped_from_baselines_that_do_not_halt():
    text_ = TINY_STUDY.replace(
        "{family: looped, params: {d_model: 16, n_heads: 2, block_layers: 1, loops: 1}}",
        "{family: ut_act, params: {d_model: 16, n_heads: 2, loops: 4, memory_slots: 0, norm: layernorm}}",
    ).replace("warmup_steps: 2,", "warmup_steps: 2, ponder_lambda: 0.01, ponder_lambda_warmup_steps: 4,")
    text_ = text_.replace("  model.params.loops: [1, 2]\n", "  model.params.halt_bias_init: [-3, 0]\n")
    compiled = compile_study(loads(with_baselines(text_)))
    for cell in compiled.cells:
        halts = cell.config["model"]["family"] == "ut_act" and cell.config["model"]["params"]["act"]
        assert ("ponder_lambda" in cell.config["train"]) == halts, cell.label
    assert {c.config["model"]["family"] for c in compiled.cells if c.baseline_of} == {"ut_act", "looped"}


def test_baselines_without_a_looped_cell_are_an_error():
    text_ = with_baselines(TINY_STUDY.replace("model.params.loops: [1, 2]", "model.params.d_model: [16, 32]"))
    with pytest.raises(SpecError, match="baselines: no cell loops"):
        compile_study(loads(text_))
    with pytest.raises(SpecError, match="baselines"):
        compile_study(loads(with_baselines(TINY_STUDY, "[iso_param, iso_param]")))


def test_the_ledger_and_results_record_what_each_baseline_matches(tmp_path):
    url = f"sqlite:///{tmp_path / 'l.db'}"
    Ledger(url).register(compile_study(loads(TINY_STUDY)))
    compiled = compile_study(loads(with_baselines(TINY_STUDY)))  # baselines added to an existing study
    Ledger(url).register(compiled)
    frame = trials_frame(Ledger(url, create=False), "tiny")
    loops2 = next(c for c in compiled.cells if c.label == "loops=2").cell_hash
    tags = dict(zip(frame.cell, frame.baseline_of, strict=True))
    assert tags["loops=1"] == f"iso_param:{loops2}" and tags["iso_flop of loops=2"] == f"iso_flop:{loops2}"
    assert tags["loops=2"] == ""
