"""Where and how a trial computes: device, precision and compile mode (`train.device`,
`train.precision`, `train.compile`), and the facts about it that are recorded with the trial.

- Device. `auto` (the default): the device the caller assigned (the Ray trainable passes the GPU Ray
  gave the trial, or the CPU when it gave none), else CUDA when a GPU is visible, else the CPU.
  `cpu` always trains on the CPU. `cuda` trains on the assigned GPU, or the first visible one; where
  none is visible the trial fails at once with one line saying so (`DeviceUnavailable`).
- Precision. `fp32` (the default): float32 everywhere, TF32 off for cuBLAS and cuDNN (set for every
  trial, since Ray reuses worker processes). `tf32`: float32 weights and activations, TF32 tensor-core
  matmuls and convolutions. `bf16`: `torch.autocast(dtype=bfloat16)` around the forward and the loss,
  in training and in evaluation; weights, gradients and the optimizer stay float32.
- Compile. `none` (the default): eager. `default` and `reduce_overhead`: the model's forward is
  `torch.compile`d (the latter with CUDA graphs on a GPU) for the training step; evaluation runs the
  same weights eagerly, so its other shapes and depths cost no recompiles and no graph memory.

Everything here is process-global only where torch is (the TF32 flags), and then set explicitly for
each trial. Imports nothing but torch and the standard library.
"""

from __future__ import annotations

import contextlib
import dataclasses
import platform
from dataclasses import dataclass
from typing import Any, Protocol

import torch

DEVICES = ("auto", "cpu", "cuda")
PRECISIONS = ("fp32", "tf32", "bf16")
COMPILE_MODES = ("none", "default", "reduce_overhead")
_TORCH_COMPILE_MODE = {"default": None, "reduce_overhead": "reduce-overhead"}


class DeviceUnavailable(RuntimeError):
    """`train.device: cuda` where this trial sees no CUDA GPU."""


class RuntimeKnobs(Protocol):
    """What `Runtime.resolve` reads of a trial's `train` section (`config.TrainConfig`): None = unset."""

    @property
    def device(self) -> str | None: ...
    @property
    def precision(self) -> str | None: ...
    @property
    def compile(self) -> str | None: ...


@dataclass(frozen=True)
class Runtime:
    """The resolved device, precision and compile mode of one trial (see the module docstring)."""

    device: torch.device
    precision: str = "fp32"
    compile: str = "none"

    @classmethod
    def resolve(cls, train: RuntimeKnobs, assigned: str | torch.device | None = None) -> Runtime:
        """From a trial's `train` section (`config.TrainConfig`; unset knobs None) and the device the
        caller assigned the trial (None: nobody did, as in a direct `run_trial` call)."""
        requested = _choice("device", train.device, DEVICES)
        precision = _choice("precision", train.precision, PRECISIONS)
        compile_mode = _choice("compile", train.compile, COMPILE_MODES)
        return cls(select_device(requested, assigned), precision, compile_mode)

    @property
    def on_cuda(self) -> bool:
        return self.device.type == "cuda"

    def apply_backends(self) -> None:
        """Set the TF32 switches this precision implies (process-global in torch; set on every trial).
        On a CPU they change nothing computed, but are set the same way so the recorded facts agree."""
        tf32 = self.precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        if self.on_cuda:
            torch.cuda.set_device(self.device)

    def autocast(self, cache: bool = True) -> contextlib.AbstractContextManager:
        """The context the forward and loss run in: bf16 autocast, or nothing. `cache=False` where the step is
        captured in a CUDA graph (autocast's cast cache must not outlive a capture)."""
        if self.precision == "bf16":
            return torch.autocast(self.device.type, dtype=torch.bfloat16, cache_enabled=cache)
        return contextlib.nullcontext()

    def compiled(self, model: torch.nn.Module) -> torch.nn.Module:
        """What the training step calls: `model` itself, or `torch.compile(model)`; parameters shared."""
        if self.compile == "none":
            return model
        return torch.compile(model, mode=_TORCH_COMPILE_MODE[self.compile])

    def step_begin(self) -> None:
        """Before each training forward: with CUDA graphs, tell torch a new iteration starts (the
        previous step's graph outputs are no longer read, so the graph's memory can be reused)."""
        if self.compile == "reduce_overhead" and self.on_cuda:
            torch.compiler.cudagraph_mark_step_begin()

    def to_device(self, batch: Any) -> Any:
        """A copy of a batch dataclass (tasks.Batch) with every tensor field on the device."""
        if self.device.type == "cpu":
            return batch
        changes = {
            f.name: value.to(self.device, non_blocking=True)
            for f in dataclasses.fields(batch)
            if isinstance(value := getattr(batch, f.name), torch.Tensor)
        }
        return dataclasses.replace(batch, **changes)

    def facts(self) -> dict[str, str]:
        """How this trial computes, recorded with it (the reporter's optional `facts`; MLflow params
        `runtime.<name>`): device and its name, precision, compile mode, torch and CUDA versions,
        threads, and the torch.backends switches that change float results or kernel choice."""
        cuda, cudnn = torch.backends.cuda, torch.backends.cudnn
        facts = {
            "device": str(self.device),
            "device_name": device_name(self.device),
            "precision": self.precision,
            "compile": self.compile,
            "torch_version": str(torch.__version__),
            "cuda_version": str(torch.version.cuda),
            "threads": str(torch.get_num_threads()),
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "cuda_matmul_allow_tf32": str(cuda.matmul.allow_tf32),
            "cuda_matmul_allow_bf16_reduced_precision_reduction": str(
                cuda.matmul.allow_bf16_reduced_precision_reduction
            ),
            "cudnn_enabled": str(cudnn.enabled),
            "cudnn_allow_tf32": str(cudnn.allow_tf32),
            "cudnn_benchmark": str(cudnn.benchmark),
            "cudnn_deterministic": str(cudnn.deterministic),
            "deterministic_algorithms": str(torch.are_deterministic_algorithms_enabled()),
            "sdp_flash": str(cuda.flash_sdp_enabled()),
            "sdp_mem_efficient": str(cuda.mem_efficient_sdp_enabled()),
            "sdp_math": str(cuda.math_sdp_enabled()),
        }
        if self.on_cuda:
            major, minor = torch.cuda.get_device_capability(self.device)
            facts["device_capability"] = f"{major}.{minor}"
            facts["cudnn_version"] = str(cudnn.version())
        return facts


def select_device(requested: str = "auto", assigned: str | torch.device | None = None) -> torch.device:
    """The device a trial trains on (rules in the module docstring)."""
    if requested not in DEVICES:
        raise ValueError(f"train.device must be one of {', '.join(DEVICES)}; got {requested!r}")
    assigned = torch.device(assigned) if assigned is not None else None
    if requested == "cpu" or (requested == "auto" and assigned is not None and assigned.type == "cpu"):
        return torch.device("cpu")
    wanted = assigned if assigned is not None and assigned.type == "cuda" else None
    if not torch.cuda.is_available():
        if requested == "auto" and wanted is None:
            return torch.device("cpu")
        if wanted is not None:
            why = f"it was assigned {wanted}, but torch {torch.__version__} sees no CUDA GPU"
        elif assigned is not None:
            why = "no GPU was assigned to it: resources.gpu is 0"
        else:
            why = f"torch {torch.__version__} sees no CUDA GPU"
        raise DeviceUnavailable(
            f"train.device is {requested!r} but this trial has no GPU ({why}); set resources.gpu > 0 and run "
            "where a GPU is, or set train.device: cpu"
        )
    index = wanted.index if wanted is not None and wanted.index is not None else 0
    if index >= torch.cuda.device_count():
        raise DeviceUnavailable(
            f"the trial was assigned cuda:{index}, but {torch.cuda.device_count()} GPU(s) are visible"
        )
    return torch.device("cuda", index)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _choice(name: str, value: str | None, allowed: tuple[str, ...]) -> str:
    value = value or allowed[0]  # unset: the first (the default)
    if value not in allowed:
        raise ValueError(f"train.{name} must be one of {', '.join(allowed)}; got {value!r}")
    return value
