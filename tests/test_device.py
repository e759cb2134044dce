"""Device, precision and compile mode, on the CPU: device selection, the options'
validation and recording, the bf16 autocast path, fp32 results unchanged, and the import rule that
lets a trial run on a bare GPU machine (torch, numpy, pydantic and the standard library only).

The same paths on a real GPU: benchmarks/gpu_trainer.py (docs/performance.md)."""

import ast
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import TINY_STUDY

from studyrunner.study import compile_study, loads
from studyrunner.tasks import Batch
from studyrunner.train import MemoryReporter, run_trial
from studyrunner.train import device as device_mod
from studyrunner.train.config import TrainConfig
from studyrunner.train.device import DeviceUnavailable, Runtime, select_device

TIMING = {"tokens_per_sec", "step_time_ms", "train_time_s"}
PACKAGE = Path(__file__).resolve().parents[1] / "studyrunner"


def strip(metrics):
    return {k: v for k, v in metrics.items() if k not in TIMING}


def tiny_config(study=TINY_STUDY, **train):
    config = compile_study(loads(study)).cells[1].config
    config["train"].update(train)
    return config


def knobs(device=None, precision=None, compile=None):
    """What `Runtime.resolve` reads of a train section (`RuntimeKnobs`), any values: its own checks run."""
    return SimpleNamespace(device=device, precision=precision, compile=compile)


@pytest.fixture(autouse=True)
def restore_tf32():
    """apply_backends sets torch's process-global TF32 switches; leave them as found."""
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture
def fake_gpus(monkeypatch):
    """Two visible GPUs, as far as device selection asks (nothing is allocated)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)


# ------------------------------------------------------------------------------ device selection


def test_auto_without_a_gpu_is_the_cpu(no_gpu):
    assert select_device("auto") == torch.device("cpu")
    assert select_device("auto", "cpu") == torch.device("cpu")
    assert Runtime.resolve(knobs()).device == torch.device("cpu")  # unset = auto


def test_auto_takes_the_assigned_gpu_or_none(fake_gpus):
    assert select_device("auto", "cuda:1") == torch.device("cuda", 1)
    assert select_device("auto", "cuda") == torch.device("cuda", 0)
    assert select_device("auto") == torch.device("cuda", 0)  # direct call, a GPU visible
    assert select_device("auto", "cpu") == torch.device("cpu")  # Ray gave the trial no GPU
    assert select_device("cpu", "cuda:1") == torch.device("cpu")  # an explicit cpu wins
    assert select_device("cuda", "cuda:1") == torch.device("cuda", 1)
    with pytest.raises(DeviceUnavailable, match="assigned cuda:2"):
        select_device("auto", "cuda:2")


@pytest.mark.parametrize(
    "assigned,why",
    [(None, "sees no CUDA GPU"), ("cpu", "resources.gpu is 0"), ("cuda:0", "it was assigned cuda:0")],
)
def test_cuda_without_a_gpu_is_one_clear_line(no_gpu, assigned, why):
    with pytest.raises(DeviceUnavailable) as info:
        select_device("cuda", assigned)
    message = str(info.value)
    assert "\n" not in message and why in message and "train.device" in message


def test_a_trial_asking_for_cuda_without_one_fails_before_training(no_gpu):
    reporter = MemoryReporter()
    with pytest.raises(DeviceUnavailable, match="train.device is 'cuda'"):
        run_trial(tiny_config(device="cuda"), seed=0, reporter=reporter)
    assert reporter.rows == []


@pytest.mark.parametrize("knob,value", [("device", "gpu"), ("precision", "fp16"), ("compile", "max_autotune")])
def test_unknown_values_are_refused(knob, value):
    with pytest.raises(ValueError, match=f"train.{knob} must be one of"):
        Runtime.resolve(knobs(**{knob: value}))  # the trial config refuses them too (TrainConfig's types)
    with pytest.raises(ValueError, match=knob):
        TrainConfig.model_validate({**tiny_config()["train"], knob: value})


# ---------------------------------------------------------------------------- the study file


def test_the_knobs_are_validated_and_left_out_of_the_config_when_unset():
    unset = compile_study(loads(TINY_STUDY))
    assert not {"device", "precision", "compile"} & set(unset.cells[0].config["train"])
    study = TINY_STUDY.replace("log_every: 4}", "log_every: 4, device: cpu, precision: bf16, compile: none}")
    assert study != TINY_STUDY
    set_ = compile_study(loads(study))
    train = set_.cells[0].config["train"]
    assert (train["device"], train["precision"], train["compile"]) == ("cpu", "bf16", "none")
    assert set_.cells[0].cell_hash != unset.cells[0].cell_hash  # set, they are part of the cell
    with pytest.raises(Exception, match="precision"):
        loads(TINY_STUDY.replace("log_every: 4}", "log_every: 4, precision: fp16}"))


def test_quickstart_hashes_unchanged():
    study = Path(__file__).resolve().parents[1] / "studies" / "quickstart.yaml"
    hashes = [c.cell_hash for c in compile_study(loads(study.read_text())).cells]
    assert hashes == ["b0798ba908c7", "ef712b8ca8ea", "d7173e55d97a"]


# -------------------------------------------------------------------------- training on the CPU


def test_fp32_on_the_cpu_is_unchanged_by_the_explicit_defaults():
    reporters = MemoryReporter(), MemoryReporter()
    default = run_trial(tiny_config(), seed=0, reporter=reporters[0])
    explicit = run_trial(tiny_config(device="cpu", precision="fp32", compile="none"), seed=0, reporter=reporters[1])
    assert strip(default) == strip(explicit)  # ==: bit-identical
    assert [strip(r) for r in reporters[0].rows] == [strip(r) for r in reporters[1].rows]


def test_facts_are_recorded_once_per_attempt(no_gpu):
    reporter = MemoryReporter()
    run_trial(tiny_config(), seed=0, reporter=reporter)
    facts = reporter.run_facts
    assert facts["device"] == "cpu" and facts["device_name"]
    assert (facts["precision"], facts["compile"]) == ("fp32", "none")
    assert facts["cuda_matmul_allow_tf32"] == facts["cudnn_allow_tf32"] == "False"
    assert facts["torch_version"] == torch.__version__ and facts["threads"] == "1"
    assert all(isinstance(v, str) for v in facts.values())

    run_trial(tiny_config(precision="tf32"), seed=0, reporter=reporter)
    assert reporter.run_facts["precision"] == "tf32"
    assert reporter.run_facts["cuda_matmul_allow_tf32"] == reporter.run_facts["cudnn_allow_tf32"] == "True"
    run_trial(tiny_config(), seed=0, reporter=reporter)  # the next trial in a reused worker resets them
    assert reporter.run_facts["cuda_matmul_allow_tf32"] == "False"


def test_bf16_autocast_runs_on_the_cpu_and_changes_the_arithmetic(monkeypatch):
    entered = []
    autocast = torch.autocast

    def spy(device_type, dtype=None, **kw):
        entered.append((device_type, dtype))
        return autocast(device_type, dtype=dtype, **kw)

    monkeypatch.setattr(device_mod.torch, "autocast", spy)
    fp32 = run_trial(tiny_config(steps=24, warmup_steps=2, lr=3e-3), seed=0)
    assert entered == []
    reporter = MemoryReporter()
    bf16 = run_trial(tiny_config(steps=24, warmup_steps=2, lr=3e-3, precision="bf16"), seed=0, reporter=reporter)
    assert entered and set(entered) == {("cpu", torch.bfloat16)}
    assert all(v == v and abs(v) != float("inf") for v in bf16.values())
    assert bf16["train_loss"] != fp32["train_loss"]  # autocast really changed the arithmetic
    losses = [v for _, v in reporter.series("train_loss")]
    assert losses[-1] < losses[0]  # and it still learns
    assert reporter.run_facts["precision"] == "bf16"


def test_bf16_resumes_bit_identically(tmp_path):
    class Crash(MemoryReporter):
        def log(self, step, metrics):
            if step == 8:  # before the step-8 checkpoint: resumes from step 4
                raise RuntimeError("interrupted")
            super().log(step, metrics)

    config = tiny_config(precision="bf16", checkpoint_every=4)
    expected = run_trial(config, seed=0)
    with pytest.raises(RuntimeError, match="interrupted"):
        run_trial(config, 0, Crash(), checkpoints=tmp_path)
    assert strip(run_trial(config, 0, MemoryReporter(), checkpoints=tmp_path)) == strip(expected)


@pytest.mark.parametrize("mode,torch_mode", [("default", None), ("reduce_overhead", "reduce-overhead")])
def test_compile_wraps_the_training_model_only(monkeypatch, mode, torch_mode):
    """torch.compile itself is exercised on the GPU (benchmarks/gpu_trainer.py); here: what is compiled,
    with which mode, and that evaluation runs the eager model with the same weights."""
    calls = []

    class Wrapped(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner, self.calls = inner, 0

        def forward(self, *args, **kwargs):
            self.calls += 1
            return self.inner(*args, **kwargs)

    def fake_compile(model, mode=None):
        calls.append(mode)
        return Wrapped(model)

    monkeypatch.setattr(device_mod.torch, "compile", fake_compile)
    from studyrunner.train.trainer import build_trial

    trial = build_trial(tiny_config(compile=mode), seed=0)
    assert calls == [torch_mode]
    assert isinstance(trial.step_model, Wrapped) and trial.step_model.inner is trial.model
    reporter = MemoryReporter()
    final = run_trial(tiny_config(compile=mode), seed=0, reporter=reporter)
    assert reporter.run_facts["compile"] == mode
    # a stand-in compile that computes nothing different gives the eager run's numbers
    assert strip(final) == strip(run_trial(tiny_config(), seed=0))


def test_batches_stay_put_on_the_cpu():
    batch = Batch(
        torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=bool)
    )
    assert Runtime(torch.device("cpu")).to_device(batch) is batch


# ------------------------------------------------------------------------------ the import rule

BARE = {"ray", "mlflow", "sqlalchemy", "pandas", "pyarrow", "yaml", "rich", "typer", "click", "alembic"}


@pytest.mark.e2e
def test_train_models_tasks_import_nothing_of_the_platform():
    code = (
        "import sys, json\n"
        "import studyrunner.train, studyrunner.train.device, studyrunner.train.checkpoint\n"
        "import studyrunner.models, studyrunner.tasks\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(json.loads(out.stdout))
    assert not loaded & BARE, sorted(loaded & BARE)


def test_module_level_imports_are_torch_numpy_pydantic_stdlib_or_each_other():
    """A static scan of what `train`, `models`, `tasks` and the shared modules they use import."""
    allowed_roots = {"torch", "numpy", "pydantic", "__future__"} | set(sys.stdlib_module_names)
    shared = {"params", "registry", "errors"}  # studyrunner/<name>.py, themselves scanned
    files = [p for package in ("train", "models", "tasks") for p in sorted((PACKAGE / package).glob("*.py"))]
    files += [PACKAGE / f"{name}.py" for name in sorted(shared)]
    bad = []
    for path in files:
        top_level = path.parent == PACKAGE  # studyrunner/x.py: `from .y` is studyrunner.y
        for node in ast.parse(path.read_text()).body:  # module level: lazy imports may be optional
            if isinstance(node, ast.Import):
                names = [(0, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [(node.level, node.module or "")]
            else:
                continue
            for level, name in names:
                root = name.split(".")[0]
                if level == 0:
                    ok = root in allowed_roots
                elif level == 1:
                    ok = not top_level or root in shared
                else:
                    ok = level == 2 and not top_level and root in {"train", "models", "tasks"} | shared
                if not ok:
                    bad.append(f"{path.relative_to(PACKAGE)}: {'.' * level}{name}")
    assert bad == []


# --------------------------------------------------------------------------- the Ray trainable


def test_the_trainable_runs_on_the_gpu_ray_assigned(monkeypatch):
    ray = pytest.importorskip("ray")
    from studyrunner.orchestrate.cluster import attempt as mod

    cases = [([], None, "cpu"), (["3"], "3", "cuda:0"), ([3], "1,3", "cuda:1"), (["2"], None, "cuda:2")]
    for ids, visible, expected in cases:
        monkeypatch.setattr(ray, "get_gpu_ids", lambda ids=ids: ids)
        if visible is None:
            monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        else:
            monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert mod.assigned_device() == expected, (ids, visible)


def test_the_tune_reporter_sends_facts_with_the_next_record(monkeypatch):
    pytest.importorskip("ray")
    from studyrunner.orchestrate.cluster import attempt as mod

    sent = []
    monkeypatch.setattr(mod.tune, "report", sent.append)
    reporter = mod.TuneReporter()
    reporter.facts({"device": "cuda:0"})
    reporter.log(0, {"params": 1.0})
    reporter.log(4, {"train_loss": 1.0})
    assert sent[0] == {"step": 0, "metrics": {"params": 1.0}, "final": False, "facts": {"device": "cuda:0"}}
    assert "facts" not in sent[1]
