"""The benchmark suite's pieces in tiny mode (structure only: no timing is asserted), the batch
prefetcher (studyrunner/train/prefetch.py) and the trainable's background report sender."""

from __future__ import annotations

import copy
import json
import threading
import time
from pathlib import Path

import pytest
import torch

from benchmarks import __main__ as suite
from benchmarks.common import figure, machine_facts, skipped
from studyrunner.tasks import build_task
from studyrunner.train import MemoryReporter, run_trial
from studyrunner.train.prefetch import Prefetcher, prefetch_enabled

TIMING = {"tokens_per_sec", "step_time_ms", "train_time_s"}
CONFIG = {
    "task": {"name": "phop", "params": {"alphabet": 4, "seq_len": 12, "hops": 1}},
    "model": {"family": "looped", "params": {"d_model": 16, "n_heads": 2, "block_layers": 1, "loops": 2}},
    "train": {
        "steps": 12, "batch_size": 8, "lr": 1e-3, "warmup_steps": 2, "min_lr_ratio": 0.1, "weight_decay": 0.1,
        "betas": [0.9, 0.98], "grad_clip": 1.0, "log_every": 4,
    },
    "eval": {"every": 6, "examples": 32},
}  # fmt: skip


def _task():
    return build_task("phop", CONFIG["task"]["params"], seed=3)


def _same(a, b) -> bool:
    return all(torch.equal(getattr(a, f), getattr(b, f)) for f in ("inputs", "targets", "loss_mask"))


def _prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "batch-prefetch"]


# ------------------------------------------------------------------------------------- prefetcher


@pytest.mark.parametrize("start", [0, 5])
def test_prefetcher_yields_each_steps_batch_in_order(start):
    task = _task()
    with Prefetcher(lambda s: task.train_batch(s, 8), start, 12) as batches:
        for step in range(start, 12):
            assert _same(batches.get(step), task.train_batch(step, 8))
        assert batches.next_step == 12
    assert not batches.alive


def test_prefetcher_refuses_steps_out_of_order():
    task = _task()
    with Prefetcher(lambda s: task.train_batch(s, 8), 2, 6) as batches:
        with pytest.raises(RuntimeError, match="asked for step 3"):
            batches.get(3)
        assert _same(batches.get(2), task.train_batch(2, 8))
        with pytest.raises(RuntimeError):
            batches.get(2)


def test_prefetcher_close_stops_its_thread_early():
    made = []

    def make(step):
        made.append(step)
        return step

    batches = Prefetcher(make, 0, 10_000, depth=2)
    assert batches.get(0) == 0
    time.sleep(0.05)  # the thread fills its queue and waits
    batches.close()
    assert not batches.alive
    assert len(made) < 10  # it made a few ahead, not the whole run


def test_prefetcher_raises_a_generation_error_at_its_step():
    def make(step):
        if step == 2:
            raise ValueError("bad step")
        return step

    with Prefetcher(make, 0, 5) as batches:
        assert [batches.get(0), batches.get(1)] == [0, 1]
        with pytest.raises(ValueError, match="bad step"):
            batches.get(2)
    assert not batches.alive


def test_prefetch_policy_follows_the_environment(monkeypatch):
    monkeypatch.setenv("STUDYRUNNER_PREFETCH", "0")
    assert not prefetch_enabled(torch.device("cpu"))
    monkeypatch.setenv("STUDYRUNNER_PREFETCH", "1")
    assert prefetch_enabled(torch.device("cpu"))


def test_run_trial_is_bit_identical_with_and_without_prefetch(monkeypatch, tmp_path):
    def final(mode, checkpoints=None, reporter=None):
        monkeypatch.setenv("STUDYRUNNER_PREFETCH", mode)
        out = run_trial(copy.deepcopy(CONFIG), 0, reporter or MemoryReporter(), checkpoints=checkpoints)
        return {k: v for k, v in out.items() if k not in TIMING}

    off, on = final("0"), final("1")
    assert on == off
    assert not _prefetch_threads()  # run_trial stopped its prefetcher

    class Crash(MemoryReporter):
        def log(self, step, metrics):
            if step == 8:
                raise KeyboardInterrupt
            super().log(step, metrics)

    cfg_every = copy.deepcopy(CONFIG)
    cfg_every["train"]["checkpoint_every"] = 3
    monkeypatch.setenv("STUDYRUNNER_PREFETCH", "1")
    with pytest.raises(KeyboardInterrupt):
        run_trial(cfg_every, 0, Crash(), checkpoints=tmp_path)
    assert not _prefetch_threads()  # stopped on the way out too
    resumed = MemoryReporter()
    out = run_trial(cfg_every, 0, resumed, checkpoints=tmp_path)  # the prefetcher restarts at step 6
    assert resumed.starts == [6]
    assert {k: v for k, v in out.items() if k not in TIMING} == off


# --------------------------------------------------------------------------------- report sender


def test_background_reports_arrive_in_order_before_finish_returns():
    from studyrunner.orchestrate.cluster.attempt import TuneReporter

    sent = []

    def slow(result):
        time.sleep(0.01)
        sent.append(result)

    reporter = TuneReporter(slow, background=True)
    reporter.start(0)
    for step in range(1, 6):
        reporter.log(step, {"train_loss": float(step)})
    assert len(sent) < 6  # the training thread did not wait for each
    reporter.finish("succeeded", 5, {"train_loss": 5.0})
    assert [r.get("step") for r in sent] == [1, 2, 3, 4, 5, 5]
    assert sent[-1]["final"] and not any(t.name == "tune-report" for t in threading.enumerate())


def test_background_report_error_is_raised_on_the_training_thread():
    from studyrunner.orchestrate.cluster.attempt import TuneReporter

    def stopped(result):
        raise SystemExit(0)  # what tune.report does when Tune stops the trial

    reporter = TuneReporter(stopped, background=True)
    reporter.start(0)
    reporter.log(1, {"train_loss": 1.0})
    reporter.flush(check=False)
    with pytest.raises(SystemExit):
        reporter.tick(1)
    reporter.close()


# -------------------------------------------------------------------------------------- the suite


def test_figure_summarises_repeats():
    f = figure([3.0, 1.0, 2.0], "s", target="< 2.5")
    assert (f["median"], f["min"], f["max"], f["repeats"], f["meets_target"]) == (2.0, 1.0, 3.0, 3, True)
    assert skipped("no GPU")["skipped"] == "no GPU"
    facts = machine_facts()
    assert {"cpu_count", "torch_threads", "device", "git_sha", "torch"} <= facts.keys()


def test_seeds_together_results_are_normalised(monkeypatch):
    out = suite._normalise({"figures": {"speedup": figure([2.0, 3.0], "x")}, "details": {"seeds": 8}})
    assert out["figures"]["speedup"]["median"] == 2.5 and out["details"] == {"seeds": 8}
    bare = suite._normalise({"speedup": 2.0, "note": "text"})
    assert bare["figures"]["speedup"]["median"] == 2.0 and bare["details"] == {"note": "text"}
    monkeypatch.setitem(suite.MODULES, "seeds_together", "no_such_module_here")
    assert suite.run_one("seeds_together", True, True)["figures"] == {"seeds_together": {"skipped": "not available"}}


def _without_slow_seeds_together() -> list[str]:
    """seeds_together is another module's: in the tiny suite only if absent or it has a tiny mode."""
    import importlib.util
    import inspect

    if importlib.util.find_spec("benchmarks.seeds_together") is None:
        return list(suite.ORDER)
    from benchmarks import seeds_together

    tiny = "tiny" in inspect.signature(seeds_together.measure).parameters
    return [n for n in suite.ORDER if tiny or n != "seeds_together"]


@pytest.mark.e2e
def test_suite_tiny_writes_every_figure_and_the_machine(tmp_path):
    path = tmp_path / "result.json"
    names = _without_slow_seeds_together()
    assert suite.main(["all", "--tiny", "--only", ",".join(names), "--out", str(path)]) == 0
    result = json.loads(path.read_text())
    assert {"cpu_count", "torch_threads", "device", "git_sha", "torch", "host"} <= result["machine"].keys()
    assert list(result["measurements"]) == names
    for name, measured in result["measurements"].items():
        assert measured["figures"], name
        for fig_name, f in measured["figures"].items():
            assert not str(f.get("skipped", "")).startswith("error"), (name, fig_name, f)
            assert "skipped" in f or {"median", "min", "max", "repeats", "unit"} <= f.keys(), (name, fig_name)
    figures = {k for m in result["measurements"].values() for k in m["figures"]}
    assert {
        "compile_study_s", "status_command_s", "results_frame_s", "trainer_cpu_efficiency",
        "large_cell_mfu", "platform_utilisation", "platform_fixed_cost_per_trial_s",
    } <= figures  # fmt: skip
    if not torch.cuda.is_available():
        assert result["measurements"]["large_cell"]["figures"]["large_cell_mfu"]["skipped"] == "no GPU"


def test_large_cell_runs_its_code_path_on_the_cpu():
    from benchmarks import large_cell

    out = large_cell.measure(quick=True, tiny=True, device="cpu")
    assert {"median", "min", "max"} <= out["figures"]["large_cell_mfu"].keys()
    assert out["details"]["model_flops_per_step"] > 0


def test_gpu_study_verdicts_decide_a_first_look_from_json_lines(tmp_path):
    """benchmarks/gpu_study_verdicts.py: finished rows become trials of their cells; unfinished ones are left out."""
    from benchmarks.gpu_study_verdicts import frame
    from studyrunner.analysis.claims import verify
    from studyrunner.analysis.data import from_frame
    from studyrunner.study import compile_study, loads

    study_file = Path("studies/quickstart.yaml")
    cells = compile_study(loads(study_file.read_text())).cells
    rows = []
    for cell in cells:
        loops = cell.config["model"]["params"]["loops"] * cell.config["model"]["params"].get("block_layers", 1)
        for seed in range(5):
            rows.append(
                {
                    "cell_hash": cell.cell_hash,
                    "label": cell.label,
                    "overrides": cell.overrides,
                    "seed": seed,
                    "status": "succeeded",
                    "eval_accuracy": 0.3 + 0.1 * (loops > 1) + 0.001 * seed,
                }
            )
    rows.append({**rows[0], "status": "unfinished", "step": 1000, "seed": 9})
    results = tmp_path / "r.jsonl"
    results.write_text("\n".join(json.dumps(r) for r in rows))
    trials, study, unfinished = frame(study_file, results)
    assert len(trials) == 3 * 5 and trials.cell_hash.nunique() == 3 and [r["seed"] for r in unfinished] == [9]
    data = from_frame(trials, study.name, study.metric.name, study.metric.mode, study.failure, study.claims)
    assert data.missing == 0
    verdicts = {v.claim: v.verdict for v in verify(data)}
    assert verdicts["eval_accuracy[block_layers=1, loops=4] > eval_accuracy[block_layers=1, loops=1]"] == "supported"


@pytest.mark.e2e  # its fractional part runs packs in processes at once
def test_gpu_suite_tiny_writes_every_part_naming_the_device(tmp_path):
    """benchmarks/gpu_suite.py --tiny (what CI runs in place of the GPU): every part runs and lands in the JSON,
    which names the device; no figure is asserted (toy sizes on a CPU)."""
    from benchmarks import gpu_suite

    out = tmp_path / "gpu_suite.json"
    assert gpu_suite.main(["--tiny", "--out", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["device"].startswith("cpu") and results["tiny"] is True
    for part in ("step", "packed", "fractional", "large_cell", "first_look"):
        assert "error" not in results[part], results[part]
    assert results["packed"]["packed_2"]["graph"] == "no: not on a CUDA device"
    assert results["first_look"]["finished"] == results["first_look"]["trials"] > 0
    assert set(results["targets"]) >= {"packed_8_over_one_trial", "large_cell_mfu"}
