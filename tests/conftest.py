import textwrap
from pathlib import Path

import pytest
import torch

# A study small enough to train in seconds: the shape of studies/quickstart.yaml at toy size.
TINY_STUDY = """\
name: tiny
description: toy looped vs unlooped
task: {name: phop, params: {alphabet: 4, seq_len: 12, hops: 1}}
model: {family: looped, params: {d_model: 16, n_heads: 2, block_layers: 1, loops: 1}}
train: {steps: 12, batch_size: 16, lr: 1.0e-3, warmup_steps: 2, weight_decay: 0.1, grad_clip: 1.0, log_every: 4}
eval: {every: 6, examples: 32}
grid:
  model.params.loops: [1, 2]
seeds: [0, 1]
resources: {cpu: 1, gpu: 0}
metric: {name: eval_accuracy, mode: max}
"""


@pytest.fixture
def write_study(tmp_path: Path):
    def write(text: str, name: str = "study.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text))
        return path

    return write


@pytest.fixture(autouse=True)
def one_thread():
    """CPU results depend on the thread count; tests train with one, as a `cpu: 1` trial does."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def small_sudoku_pools(tmp_path, monkeypatch):
    """Sudoku pools in chunks of 64 (fast), cached under a fresh folder; in-process cache cleared around it."""
    import studyrunner.tasks.sudoku as sudoku

    monkeypatch.setenv("STUDYRUNNER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("STUDYRUNNER_SUDOKU_CACHE", raising=False)
    monkeypatch.setattr(sudoku, "CHUNK", 64)
    sudoku._pool.cache_clear()
    yield
    sudoku._pool.cache_clear()
