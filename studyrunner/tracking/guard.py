"""MLflow calls that never stop a study: a failed call is reported to the caller, not raised.

The ledger and the Parquet curves are the record of a study; MLflow is a view of it. So when MLflow
goes away mid-study the driver goes on: each guarded call says whether it reached MLflow (the caller
flags the trial `mlflow_dirty`, and `studyrunner sync-mlflow` backfills later), and while MLflow is down
calls are skipped at once instead of each waiting on a dead server, with one probe every
`retry_after_s` to notice it is back.

    guard = MlflowGuard(tracker)
    ok, run_id = guard.call(tracker.trial_run, experiment_id, parent, study, trial)
    if not ok:
        ledger.set_mlflow_dirty(trial.trial_key)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from ..urls import mask_text, mask_url
from .http import bound_http_retries

log = logging.getLogger(__name__)

RETRY_AFTER_S = 30.0
# Distinct refusals (a bad request MLflow answered) warned about before the guard goes quiet.
MAX_REFUSAL_WARNINGS = 20


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__


def is_outage(exc: BaseException) -> bool:
    """True unless the store answered and refused this one request (4xx: a deleted run, a param that
    may not change): then MLflow is up, and only this call is lost."""
    from mlflow.exceptions import MlflowException

    if isinstance(exc, MlflowException):
        return not 400 <= exc.get_http_status_code() < 500 or exc.get_http_status_code() == 429
    return True  # connection errors, timeouts, database errors, and anything we cannot classify


class MlflowGuard:
    """Wraps the calls made to one tracking store (a `Tracker`'s). Thread-safe."""

    def __init__(
        self,
        tracker: Any,
        retry_after_s: float = RETRY_AFTER_S,
        *,
        study: str | None = None,
        sync_hint: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        warn: Callable[[str], None] | None = None,
    ):
        bound_http_retries(getattr(tracker, "uri", None))  # a call to a dead server fails in seconds, not minutes
        self._real_uri = getattr(tracker, "uri", None)
        self.uri = mask_url(self._real_uri) if self._real_uri else "the tracking store"  # as shown in messages
        self.retry_after_s = retry_after_s
        self.sync_hint = sync_hint or f"studyrunner sync-mlflow {study or 'STUDY'}"
        self._clock = clock
        self._warn = warn or log.warning
        self._lock = threading.Lock()
        self._down = False
        self._next_probe = 0.0
        self._probing = False  # one thread probes; the others skip meanwhile
        self._refusals: set[str] = set()
        self.outages = 0  # times MLflow went down
        self.failed = 0  # calls that did not reach MLflow: failed or skipped

    @property
    def down(self) -> bool:
        return self._down

    @property
    def ever_down(self) -> bool:
        """MLflow was unreachable at some point: some trials may be `mlflow_dirty`."""
        return self.outages > 0

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[bool, Any]:
        """(True, fn's value), or (False, None) when MLflow failed or is down (the call was skipped)."""
        if not self._may_call():
            return False, None
        try:
            value = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - MLflow raises many types; the study must go on
            self._failed(fn, exc)
            return False, None
        except BaseException:  # Ctrl-C mid-probe: let the next call probe
            with self._lock:
                self._probing = False
            raise
        self._succeeded()
        return True, value

    def _may_call(self) -> bool:
        with self._lock:
            if not self._down:
                return True
            if self._probing or self._clock() < self._next_probe:
                self.failed += 1
                return False
            self._probing = True
            return True

    def _failed(self, fn: Callable[..., Any], exc: Exception) -> None:
        outage = is_outage(exc)
        with self._lock:
            self.failed += 1
            self._probing = False
            if not outage:
                news = self._note_refusal(fn, exc)
                came_back, self._down = self._down, False  # it answered, so it is up
            else:
                news = self._note_outage(exc)
                came_back = False
                self._next_probe = self._clock() + self.retry_after_s
        if came_back:
            self._warn(f"MLflow is back ({self.uri})")
        if news:
            self._warn(news)

    def _note_outage(self, exc: Exception) -> str | None:
        if self._down:
            return None  # a failed probe: still down, nothing new to say
        self._down = True
        self.outages += 1
        return (
            f"MLflow at {self.uri} is unreachable ({mask_text(first_line(exc), self._real_uri)}): trials go on; "
            f"the ledger keeps everything; run `{self.sync_hint}` afterwards"
        )

    def _note_refusal(self, fn: Callable[..., Any], exc: Exception) -> str | None:
        name = getattr(fn, "__name__", repr(fn))
        why = mask_text(first_line(exc), self._real_uri)
        message = f"MLflow refused {name}: {why} (the ledger keeps it; `sync-mlflow` retries)"
        if message in self._refusals or len(self._refusals) >= MAX_REFUSAL_WARNINGS:
            return None
        self._refusals.add(message)
        return message

    def _succeeded(self) -> None:
        with self._lock:
            came_back, self._down, self._probing = self._down, False, False
        if came_back:
            self._warn(f"MLflow is back ({self.uri})")
