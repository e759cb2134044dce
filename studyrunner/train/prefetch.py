"""Training batches made ahead of the step that uses them, off its critical path.

A train batch is a pure function of (task params, trial seed, step) (the tasks' determinism contract),
so the batches a trial will use are known in advance: a background thread calls
`task.train_batch(step, batch_size)` for the next few steps while the main thread trains, and on CUDA
copies each into pinned host memory and on to the GPU (`non_blocking`, on a side stream), so the step
finds its batch already on the device. The step takes exactly the batch it would have made itself, in
order; a resumed trial starts a new prefetcher at its checkpoint step. Nothing else changes: the main
thread still does every bit of the model's arithmetic, so results are bit-identical with or without it.

Where it pays: on a GPU, where a step is a few milliseconds and generating and copying its batch on
the step's own thread costs a large share of it. On a CPU it moves the same Python and numpy work to a
second thread: with a free core it overlaps the step, with every core busy (a study filling its CPU
slots) it at best breaks even (docs/performance.md has the measurements). `prefetch_enabled` is the
policy; STUDYRUNNER_PREFETCH=0/1 overrides it (0: generate on the step's thread, as before).

Imports nothing but torch and the standard library.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

import torch

# as studyrunner.settings reads a switch (that module is the platform's: train imports nothing of it)
ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")

DEPTH = 2  # batches made ahead: one to hide the next step's generation, one of slack
_STOP = object()


def prefetch_enabled(device: torch.device) -> bool:
    """Whether a trial on `device` prefetches its train batches: on CUDA yes, on the CPU no (measured as
    no gain there, docs/performance.md); $STUDYRUNNER_PREFETCH (0 or 1) decides when set."""
    forced = os.environ.get("STUDYRUNNER_PREFETCH", "").strip().lower()
    if forced in ON + OFF:
        return forced in ON
    return device.type == "cuda"


class _Failed:
    """An exception raised while making a batch: re-raised on the training thread, at that step."""

    def __init__(self, exc: BaseException):
        self.exc = exc


class Prefetcher:
    """Makes `make(step)` for step = start, start + 1, ..., stop - 1 in a daemon thread, `depth` ahead.

    `get(step)` returns the batch of `step` and must be called for each step in order (the training
    loop does); anything else is a bug and raises. On a CUDA `device`, each batch's tensors are pinned
    and copied to the device on a side stream, and `get` makes the current stream wait for that copy.
    `close()` (or leaving the `with` block) stops the thread and waits for it."""

    def __init__(
        self,
        make: Callable[[int], Any],
        start: int,
        stop: int,
        *,
        device: torch.device | str = "cpu",
        depth: int = DEPTH,
    ) -> None:
        self.make, self.next_step, self.stop = make, start, stop
        self.device = torch.device(device)
        self._queue: queue.Queue = queue.Queue(maxsize=max(1, depth))
        self._closed = threading.Event()
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._thread = threading.Thread(target=self._run, args=(start,), name="batch-prefetch", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------------------------- the thread

    def _run(self, start: int) -> None:
        if self._stream is not None:
            torch.cuda.set_device(self.device)  # the current device is per thread: this one's is cuda:0
        for step in range(start, self.stop):
            try:
                item: Any = (step, *self._made(step))
            except BaseException as exc:  # noqa: BLE001 - handed to the training thread, raised there
                item = (step, _Failed(exc), None)
            if not self._put(item) or isinstance(item[1], _Failed):
                return
        self._put(_STOP)

    def _made(self, step: int) -> tuple[Any, torch.cuda.Event | None]:
        batch = self.make(step)
        if self._stream is None:
            return batch, None
        with torch.cuda.stream(self._stream):
            changes = {
                f.name: value.pin_memory().to(self.device, non_blocking=True)
                for f in dataclasses.fields(batch)
                if isinstance(value := getattr(batch, f.name), torch.Tensor)
            }
            ready = torch.cuda.Event()
            ready.record(self._stream)
        return dataclasses.replace(batch, **changes), ready

    def _put(self, item: Any) -> bool:
        """Queue `item` unless closed first; False once closed."""
        while not self._closed.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    # ------------------------------------------------------------------------ the training thread

    def get(self, step: int) -> Any:
        """The batch of `step` (which must be the next one), on the device."""
        if step != self.next_step or step >= self.stop:
            raise RuntimeError(f"prefetcher asked for step {step}; it makes steps {self.next_step}..{self.stop - 1}")
        while True:
            try:
                item = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("the batch prefetch thread ended early") from None
        made_step, batch, ready = item
        if isinstance(batch, _Failed):
            raise batch.exc
        assert made_step == step, (made_step, step)
        self.next_step = step + 1
        if ready is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(ready)
            for f in dataclasses.fields(batch):
                value = getattr(batch, f.name)
                if isinstance(value, torch.Tensor):
                    value.record_stream(current)  # made on the side stream, used on this one
        return batch

    def close(self) -> None:
        self._closed.set()
        while True:  # unblock a thread waiting to put
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
