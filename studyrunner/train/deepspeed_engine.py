"""The DeepSpeed engine (`train.engine: deepspeed`): this process is one data-parallel worker of a trial.

Every worker runs the same `run_trial`, in a `torch.distributed` process group its caller set up (the Ray
trainable starts `resources.workers` of them as a Ray Train run: gloo on CPUs, nccl on GPUs). Here:

- **Model and optimizer.** Built as the plain engine builds them (same seed, so the same initial weights
  on every worker), then `deepspeed.initialize` takes them: the trial's torch AdamW is DeepSpeed's client
  optimizer (its parameter groups, weight decay and betas are the plain engine's) and ZeRO partitions its
  state over the workers (stage 1), also the gradients (2), also the parameters (3). The learning rate is
  set on its groups every step, as in the plain engine; clipping is DeepSpeed's `gradient_clipping`, the
  same global-norm rule.
- **Data.** Every worker makes the step's whole batch (a function of task params, seed and step, as
  always) and trains on its slice: worker r takes micro-batches r*A .. r*A + A - 1 of the W*A equal ones
  (A = `train.deepspeed.gradient_accumulation_steps`). Each micro-batch's loss is weighted by its share of
  the batch's scored positions, so DeepSpeed's mean over workers and micro-batches is the gradient of the
  whole batch's mean loss (what the plain engine computes) and the reported `train_loss` (an all-reduce
  of the weighted losses) is the whole batch's. This assumes a task's loss is the mean over scored
  positions (`tasks.base.Task.loss`, which no task overrides). The two engines differ only by float
  rounding: the batch's matmuls and sums run in pieces and in another order, then the gradients are
  summed over workers. With dropout they differ more: each worker draws its slice's masks.
- **Evaluation.** Every worker evaluates the whole eval sets (ZeRO-3 needs every worker in each forward),
  with the plain engine's code, so the eval metrics of given weights are the plain engine's.
- **Checkpoints.** DeepSpeed's own `save_checkpoint` files of every worker (model states, its optimizer
  partition) and every worker's RNG states are gathered to rank 0, which writes them as one checkpoint
  (checkpoint.py: atomic, checksummed, on any storage, so no shared disk is needed). A resume: rank 0 reads
  the newest intact one and sends it to every worker, which hands the files to `load_checkpoint` (ZeRO 1
  and 2 read every worker's partition). The run continues bit-exactly with the same number of workers
  and ZeRO stage; another number of workers is refused (ZeRO partitions are per worker). The whole
  checkpoint passes through rank 0's memory, which suits the models studyrunner trains.
- **Stopping.** A non-finite loss is seen by every worker at once (the loss is all-reduced); the
  divergence rule, checked by rank 0's reporter, is shared by `agree`. Only rank 0 reports.

Imports deepspeed (an optional extra) only when a trial uses it; `DS_ACCELERATOR` is set to the trial's
device type first, so a CPU trial uses DeepSpeed's CPU accelerator (gloo; no Intel packages needed).
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from ..tasks import Batch
from .checkpoint import CheckpointMismatch, Checkpoints, capture_rng, restore_rng
from .config import DeepSpeedConfig, TrainConfig
from .engine import check_finite, check_schedule, schedule_state
from .trial_progress import Progress

if TYPE_CHECKING:
    from .setup import TrialSetup

TAG = "state"  # the one DeepSpeed checkpoint tag in each (temporary) checkpoint folder


class DeepSpeedUnavailable(RuntimeError):
    """deepspeed is not installed, or this process is not a worker of a process group."""


def deepspeed_config(train: TrainConfig, workers: int) -> dict[str, Any]:
    """DeepSpeed's config for a trial's `train` section on `workers` workers (fp32; no DeepSpeed
    optimizer or scheduler: the trial's AdamW and learning-rate schedule are used)."""
    section = train.deepspeed or DeepSpeedConfig()  # resolved with the engine; unset: zero_stage 1
    accumulation = section.gradient_accumulation_steps
    knobs = section.model_dump(exclude={"zero_stage", "gradient_accumulation_steps"}, exclude_none=True)
    return {
        "train_batch_size": train.batch_size,
        "train_micro_batch_size_per_gpu": train.batch_size // (workers * accumulation),
        "gradient_accumulation_steps": accumulation,
        "gradient_clipping": float(train.grad_clip),  # 0: off
        "zero_optimization": {"stage": section.zero_stage, **knobs},
        "steps_per_print": 2**31 - 1,  # its own progress lines: the trial reports its records
        "wall_clock_breakdown": False,
    }


def _import_deepspeed(on_cuda: bool):
    os.environ["DS_ACCELERATOR"] = "cuda" if on_cuda else "cpu"
    try:
        import deepspeed
    except ImportError as exc:
        raise DeepSpeedUnavailable(
            f"train.engine: deepspeed needs the deepspeed package on every worker ({exc}); install it with "
            "pip install 'studyrunner[deepspeed]'"
        ) from None
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    return deepspeed


class DeepSpeedEngine:
    """One worker's part of a DeepSpeed trial (the module docstring says how it trains)."""

    def __init__(self, trial: TrialSetup) -> None:
        if not (dist.is_available() and dist.is_initialized()):
            raise DeepSpeedUnavailable(
                "train.engine: deepspeed trains in a torch.distributed process group, one process per worker "
                "(a submitted study starts resources.workers of them); this process is in none"
            )
        deepspeed = _import_deepspeed(trial.runtime.on_cuda)
        self.rank, self.workers = dist.get_rank(), dist.get_world_size()
        self.leader = self.rank == 0
        self.device = trial.runtime.device  # of the collectives' tensors: the CPU with gloo, the GPU with nccl
        config = deepspeed_config(trial.train, self.workers)
        self.stage = config["zero_optimization"]["stage"]
        self.accumulation = config["gradient_accumulation_steps"]
        self.micro = config["train_micro_batch_size_per_gpu"]
        if self.micro * self.workers * self.accumulation != trial.train.batch_size:
            raise ValueError(
                f"train.batch_size {trial.train.batch_size} does not split over {self.workers} workers x "
                f"{self.accumulation} micro-batches"
            )
        self.ds, *_ = deepspeed.initialize(model=trial.model, optimizer=trial.optimizer, config=config)
        hosts: list[Any] = [None] * self.workers
        dist.all_gather_object(hosts, socket.gethostname())
        self._facts = {
            "engine": "deepspeed",
            "deepspeed_version": str(deepspeed.__version__),
            "zero_stage": str(self.stage),
            "workers": str(self.workers),
            "worker_hosts": ",".join(sorted(set(hosts))),
            "micro_batch_size": str(self.micro),
            "gradient_accumulation_steps": str(self.accumulation),
            "dist_backend": str(dist.get_backend()),
        }

    def facts(self) -> dict[str, str]:
        return dict(self._facts)

    # ------------------------------------------------------------------------------------ a step

    def _my_micro_batches(self, batch: Batch) -> list[Batch]:
        first = self.rank * self.accumulation
        return [batch.slice(i * self.micro, (i + 1) * self.micro) for i in range(first, first + self.accumulation)]

    def step(self, trial: TrialSetup, progress: Progress) -> tuple[float, int]:
        started = time.perf_counter()
        step = progress.step
        lr = trial.lr(step)
        for group in self.ds.optimizer.param_groups:
            group["lr"] = lr
        batch = trial.batch(step)
        scored = batch.loss_mask.sum()
        # DeepSpeed divides the loss by the micro-batches and averages gradients over the workers: undo both,
        # so the gradient is that of the sum of the shares, the whole batch's mean loss.
        scale = self.workers * self.accumulation
        total = torch.zeros((), device=self.device)
        for part in self._my_micro_batches(batch):
            with trial.runtime.autocast():
                result = self.ds(part.inputs)
                if part.loss_mask.any():
                    loss = trial.task.loss(result.logits, part) * (part.loss_mask.sum() / scored)
                else:  # nothing scored in this slice: no share, but every worker must run its backward
                    loss = result.logits.sum() * 0.0
                if trial.nan_at == step + 1:
                    loss = loss * float("nan")
            self.ds.backward(loss * scale)
            self.ds.step()  # DeepSpeed steps the optimizer after the last micro-batch only
            total += loss.detach().float()
        dist.all_reduce(total)
        loss_value = total.item()
        check_finite(loss_value, step)
        elapsed = time.perf_counter() - started
        tokens = batch.inputs.numel()
        progress.window.add(loss_value, elapsed, {}, {}, {})
        progress.add_step(elapsed, tokens)
        return lr, tokens

    def agree(self, stop: bool) -> bool:
        flag = torch.tensor([int(stop)], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    # ------------------------------------------------------------------------------ checkpoints

    def _identity(self) -> dict[str, Any]:
        return {"name": "deepspeed", "workers": self.workers, "zero_stage": self.stage}

    def save(self, store: Checkpoints, trial: TrialSetup, progress: Progress) -> None:
        with tempfile.TemporaryDirectory(prefix="studyrunner-deepspeed-") as folder:
            self.ds.save_checkpoint(folder, tag=TAG, save_latest=False)  # every worker writes its part
            files = {p.name: _as_tensor(p.read_bytes()) for p in sorted((Path(folder) / TAG).iterdir()) if p.is_file()}
        parts: list[Any] | None = [None] * self.workers if self.leader else None
        dist.gather_object({"files": files, "rng": capture_rng()}, parts, dst=0)
        if self.leader:
            state = {
                "engine": self._identity(),
                "workers": parts,
                "progress": progress.state_dict(),
                "schedule": schedule_state(trial, progress.step),
            }
            store.save(progress.step, state)

    def resume(self, store: Checkpoints, trial: TrialSetup) -> Progress:
        found: list[Any] = [None]
        if self.leader:  # one reader decides which checkpoint (or which problem) every worker gets
            try:
                found = [("state", store.latest())]
            except Exception as exc:  # noqa: BLE001 - sent to every worker and raised there too
                found = [("error", exc)]
        dist.broadcast_object_list(found, src=0)
        kind, state = found[0]
        if kind == "error":
            raise state
        if state is None:
            return Progress()
        written = state.get("engine") or {}
        if written != self._identity():
            raise CheckpointMismatch(
                f"the checkpoint at step {state.get('step')} in {store.storage.location} was written by "
                f"{written.get('workers', '?')} DeepSpeed workers at ZeRO stage {written.get('zero_stage', '?')}; "
                f"this attempt has {self.workers} at stage {self.stage}: set resources.workers back to "
                f"{written.get('workers', '?')}, or rerun the trial with --fresh to start over"
            )
        progress = Progress.from_state_dict(state["progress"])
        check_schedule(state, trial, progress.step)
        with tempfile.TemporaryDirectory(prefix="studyrunner-deepspeed-") as folder:
            tagged = Path(folder) / TAG
            tagged.mkdir()
            for part in state["workers"]:
                for name, data in part["files"].items():
                    (tagged / name).write_bytes(data.numpy().tobytes())
            path, _ = self.ds.load_checkpoint(
                folder, tag=TAG, load_optimizer_states=True, load_lr_scheduler_states=False
            )
        if path is None:
            raise CheckpointMismatch(f"DeepSpeed could not load the checkpoint at step {progress.step}")
        restore_rng(state["workers"][self.rank]["rng"])  # last: building the trial drew from the generators
        return progress


def _as_tensor(data: bytes) -> torch.Tensor:
    """Bytes as a uint8 tensor: what a checkpoint (read with torch.load(weights_only=True)) may hold."""
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)
