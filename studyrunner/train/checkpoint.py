"""Trial checkpoints: everything a trial needs to continue bit-exactly, written atomically, checked on read.

What one checkpoint of a plain trial holds (`run_trial` assembles it; see `engine.capture_state`; a DeepSpeed
trial's holds its workers' DeepSpeed files instead of `model`/`optimizer`/`rng`: deepspeed_engine.py):
- `model`, `optimizer`: their state dicts (AdamW moments and step counts);
- `progress`: the step (= the data position: train batches are a function of (task params, seed,
  step)), the open train window, run totals and the latest value of every reported metric, so final
  metrics and the records after a resume are the uninterrupted run's;
- `schedule`: the learning rate and auxiliary-term weights of the last step taken (derived from the
  step; recorded so a resume under changed schedule code is refused rather than silently different);
- `rng`: torch CPU, CUDA (when present), NumPy and Python global generator states;
- `trial`: the config and seed it belongs to (a checkpoint of another trial is refused, naming the
  fields that differ); `train.checkpoint_every` is left out, so changing it keeps checkpoints usable.

When: after every `train.checkpoint_every`-th step (unset: every max(1, steps // 10) steps, about a
tenth of the run, so a lost worker costs at most that much) and after the last step.

On storage a checkpoint is one object, `step-000000400.ckpt`: a magic line, the payload's length and
SHA-256, then the payload (`torch.save` bytes). It is written to a temporary name and renamed, so a
reader sees a whole file or none; the checksum catches anything else (a truncated copy, bit rot).
The newest `keep` (2) are kept. A checkpoint that is unreadable, truncated or fails its checksum is
reported (a `CheckpointWarning` and the reporter's optional `note`) and the trial falls back to the
one before it, or to step 0, and says so.

Storage is a folder on this machine or any `pyarrow.fs` URI (`s3://bucket/prefix`, `gs://...`,
`hdfs://...`, `file:///...`), so trials on many nodes need no shared disk.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import random
import re
import struct
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

FORMAT_VERSION = 1
MAGIC = b"studyrunner-checkpoint v1\n"
_HEADER = struct.Struct(">Q32s")  # payload length, SHA-256 of the payload
_NAME = re.compile(r"^step-(\d{9})\.ckpt$")
_TEMP_PREFIX = ".tmp-"
KEEP = 2

log = logging.getLogger(__name__)


class CheckpointWarning(UserWarning):
    """A checkpoint could not be used (corrupt, truncated, unreadable); the trial fell back."""


class CorruptCheckpoint(Exception):
    """The bytes of a checkpoint are not a whole, intact checkpoint."""


class CheckpointMismatch(ValueError):
    """The checkpoint belongs to another trial (config or seed) or to other schedule code."""


# ---------------------------------------------------------------------------------------- storage


@runtime_checkable
class CheckpointStorage(Protocol):
    """Where one trial's checkpoints live: a flat namespace of small objects."""

    location: str

    def names(self) -> list[str]: ...
    def read(self, name: str) -> bytes: ...
    def write_atomic(self, name: str, data: bytes) -> None: ...
    def delete(self, name: str) -> None: ...


class LocalStorage:
    """A folder on this machine (created on first write)."""

    def __init__(self, folder: str | os.PathLike[str]) -> None:
        self.folder = Path(folder)
        self.location = str(self.folder)

    def names(self) -> list[str]:
        if not self.folder.is_dir():
            return []
        return sorted(p.name for p in self.folder.iterdir() if p.is_file())

    def read(self, name: str) -> bytes:
        return (self.folder / name).read_bytes()

    def write_atomic(self, name: str, data: bytes) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        temp = self.folder / f"{_TEMP_PREFIX}{uuid.uuid4().hex}-{name}"
        try:
            with open(temp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, self.folder / name)
        finally:
            temp.unlink(missing_ok=True)
        if hasattr(os, "O_DIRECTORY"):  # make the rename itself durable
            fd = os.open(self.folder, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def delete(self, name: str) -> None:
        (self.folder / name).unlink(missing_ok=True)


class ArrowStorage:
    """Any filesystem `pyarrow.fs.FileSystem.from_uri` opens: s3://, gs://, hdfs://, file://.

    The object is written under a temporary name and moved into place; on object stores, where a
    move is a copy, the checksum still tells a whole checkpoint from a partial one."""

    def __init__(self, uri: str) -> None:
        from pyarrow import fs

        self._fs, self._root = fs.FileSystem.from_uri(uri)
        self._root = self._root.rstrip("/")
        self.location = uri

    def _path(self, name: str) -> str:
        return f"{self._root}/{name}"

    def names(self) -> list[str]:
        from pyarrow import fs

        infos = self._fs.get_file_info(fs.FileSelector(self._root, allow_not_found=True))
        return sorted(i.base_name for i in infos if i.type == fs.FileType.File)

    def read(self, name: str) -> bytes:
        with self._fs.open_input_stream(self._path(name)) as f:
            return f.readall()

    def write_atomic(self, name: str, data: bytes) -> None:
        self._fs.create_dir(self._root, recursive=True)
        temp = self._path(f"{_TEMP_PREFIX}{uuid.uuid4().hex}-{name}")
        with self._fs.open_output_stream(temp) as f:
            f.write(data)
        self._fs.move(temp, self._path(name))

    def delete(self, name: str) -> None:
        try:
            self._fs.delete_file(self._path(name))
        except FileNotFoundError:
            pass


def open_storage(location: str | os.PathLike[str] | CheckpointStorage) -> CheckpointStorage:
    """A storage object as is; a string with a scheme (`s3://...`) via pyarrow; anything else a folder."""
    if isinstance(location, CheckpointStorage):
        return location
    text = os.fspath(location)
    if "://" in text:
        return ArrowStorage(text)
    return LocalStorage(text)


# ------------------------------------------------------------------------------------ the format


def encode(state: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    payload = buffer.getvalue()
    return MAGIC + _HEADER.pack(len(payload), hashlib.sha256(payload).digest()) + payload


def decode(data: bytes) -> dict[str, Any]:
    """The state in `data`, or CorruptCheckpoint saying what is wrong with it."""
    if not data.startswith(MAGIC):
        raise CorruptCheckpoint("not a studyrunner checkpoint (bad header)")
    start = len(MAGIC) + _HEADER.size
    if len(data) < start:
        raise CorruptCheckpoint(f"truncated ({len(data)} bytes, header incomplete)")
    length, digest = _HEADER.unpack_from(data, len(MAGIC))
    payload = data[start:]
    if len(payload) != length:
        raise CorruptCheckpoint(f"truncated ({len(payload)} of {length} payload bytes)")
    if hashlib.sha256(payload).digest() != digest:
        raise CorruptCheckpoint("checksum mismatch (the content changed after it was written)")
    try:
        return torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as e:  # intact bytes this torch cannot read
        detail = " ".join(str(e).split())[:300]
        raise CorruptCheckpoint(f"unreadable payload ({type(e).__name__}: {detail})") from e


def checkpoint_name(step: int) -> str:
    return f"step-{step:09d}.ckpt"


def step_of(name: str) -> int | None:
    match = _NAME.match(name)
    return int(match.group(1)) if match else None


# ---------------------------------------------------------------------------------- RNG states


def capture_rng() -> dict[str, Any]:
    """Every global generator a trial may draw from (in a form `torch.load(weights_only=True)` reads)."""
    np_state = np.random.get_state(legacy=False)
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {
            "bit_generator": np_state["bit_generator"],
            "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "python": [version, list(internal), gauss],
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    n = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": n["bit_generator"],
            "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
            "has_gauss": n["has_gauss"],
            "gauss": n["gauss"],
        }
    )
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in state:
        if not torch.cuda.is_available() or torch.cuda.device_count() != len(state["cuda"]):
            raise CheckpointMismatch(
                f"checkpoint has CUDA generator states for {len(state['cuda'])} device(s); "
                f"this worker has {torch.cuda.device_count() if torch.cuda.is_available() else 0}"
            )
        torch.cuda.set_rng_state_all(state["cuda"])


# ------------------------------------------------------------------------------ trial identity


def trial_identity(config: dict[str, Any], seed: int) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: the config (less `train.checkpoint_every`, which does
    not change results) and the seed, as plain JSON types."""
    config = json.loads(json.dumps(config))
    config.get("train", {}).pop("checkpoint_every", None)
    return {"config": config, "seed": seed}


def _differences(saved: Any, current: Any, path: str = "") -> list[str]:
    if isinstance(saved, dict) and isinstance(current, dict):
        out = []
        for key in sorted(set(saved) | set(current), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in saved or key not in current:
                out.append(f"{sub} ({'only in this trial' if key in current else 'only in the checkpoint'})")
            else:
                out += _differences(saved[key], current[key], sub)
        return out
    return [] if saved == current else [f"{path}: checkpoint {saved!r}, this trial {current!r}"]


# --------------------------------------------------------------------------------- checkpoints


def default_every(steps: int) -> int:
    """The checkpoint interval when `train.checkpoint_every` is unset: about a tenth of the run."""
    return max(1, steps // 10)


class Checkpoints:
    """One trial's checkpoints in `storage`: when to write, writing, and finding the one to resume from.

    `every` (`train.checkpoint_every`): write after every `every`-th step; `None` = every
    `default_every(steps)` steps, about a tenth of the run. A checkpoint is also written after the
    last step. `notify(message)` receives what a user should know (fallbacks, resumes)."""

    def __init__(
        self,
        storage: CheckpointStorage,
        *,
        config: dict[str, Any],
        seed: int,
        every: int | None = None,
        keep: int = KEEP,
        notify: Callable[[str], None] | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.steps = int(config["train"]["steps"])
        self.every = every if every is not None else default_every(self.steps)
        self.storage, self.keep = storage, keep
        self.identity = trial_identity(config, seed)
        self._notify = notify or (lambda message: None)

    def due(self, done: int) -> bool:
        """Is a checkpoint written after `done` steps?"""
        return done == self.steps or done % self.every == 0

    def save(self, step: int, state: dict[str, Any]) -> None:
        """Write `state` as the checkpoint after `step` steps; keep the newest `keep`.

        Checkpoints beyond `step` (left by an attempt that got further before a fallback) are
        deleted: the trial's history now runs through this one."""
        name = checkpoint_name(step)
        state = {
            "format": FORMAT_VERSION,
            "torch": str(torch.__version__),
            "trial": self.identity,
            "step": step,
            **state,
        }
        self.storage.write_atomic(name, encode(state))
        existing = self.storage.names()
        steps = sorted((s for s in map(step_of, existing) if s is not None), reverse=True)
        stale = [s for s in steps if s > step] + [s for s in steps if s <= step][self.keep :]
        for s in stale:
            self.storage.delete(checkpoint_name(s))
        for leftover in (n for n in existing if n.startswith(_TEMP_PREFIX)):  # from a writer that died
            self.storage.delete(leftover)

    def latest(self) -> dict[str, Any] | None:
        """The newest intact checkpoint of this trial, or None (start at step 0).

        Corrupt ones are reported and skipped; one of another trial raises CheckpointMismatch."""
        names = sorted((n for n in self.storage.names() if step_of(n) is not None), key=step_of, reverse=True)
        skipped: list[str] = []
        for name in names:
            where = f"{self.storage.location}/{name}"
            try:
                state = decode(self.storage.read(name))
            except (CorruptCheckpoint, OSError) as e:
                skipped.append(name)
                later = names[names.index(name) + 1 :]
                then = f"falling back to {later[0]}" if later else "no earlier checkpoint: starting from step 0"
                self._warn(f"checkpoint {where} is unusable: {e}; {then}")
                continue
            self._check_identity(state, where)
            if state.get("step") != step_of(name):
                self._warn(f"checkpoint {where} holds step {state.get('step')}, not its name's; skipped")
                skipped.append(name)
                continue
            note = f" ({len(skipped)} newer unusable: {', '.join(skipped)})" if skipped else ""
            message = f"resuming from checkpoint {where} at step {state['step']} of {self.steps}{note}"
            log.info(message)
            self._notify(message)
            return state
        if skipped:
            self._warn(
                f"every checkpoint in {self.storage.location} is unusable ({', '.join(skipped)}); training from step 0"
            )
        return None

    def _check_identity(self, state: dict[str, Any], where: str) -> None:
        saved = state.get("trial") or {}
        if saved == self.identity:
            return
        diffs = _differences(saved, self.identity)
        shown = "; ".join(diffs[:8]) + (f"; and {len(diffs) - 8} more" if len(diffs) > 8 else "")
        raise CheckpointMismatch(
            f"checkpoint {where} belongs to another trial ({shown}); refusing to resume from it. "
            "Give each trial its own checkpoint location, or delete this one to start over."
        )

    def _warn(self, message: str) -> None:
        warnings.warn(message, CheckpointWarning, stacklevel=3)
        self._notify(message)


def final_weights(location: str | os.PathLike[str] | CheckpointStorage, config: dict[str, Any], seed: int) -> dict:
    """The model state dict of a finished trial: its checkpoint after the last step, checked to belong to
    (config, seed). What a conversion's teacher is loaded from (a `melt` cell's `model.params.teacher`)."""
    store = Checkpoints(open_storage(location), config=config, seed=seed)
    state = store.latest()
    if state is None:
        raise FileNotFoundError(f"no checkpoint of the trial in {store.storage.location}")
    if state["step"] != store.steps:
        raise ValueError(
            f"the newest checkpoint in {store.storage.location} is at step {state['step']} of {store.steps}: "
            "the trial has not finished"
        )
    return state["model"]
