"""Fault injection, so users (and the tests) can rehearse failures end to end with real processes.

    STUDYRUNNER_INJECT_FAULT=GLOB[,GLOB]   trials whose key matches raise at start: a code error
                                           (failed at once, not retried)
    STUDYRUNNER_INJECT_KILL=GLOB@STEP      the worker SIGKILLs itself after STEP steps on its first
                                           attempt: an infrastructure failure (retried, resumed from
                                           the last checkpoint)
    STUDYRUNNER_INJECT_NAN=GLOB@STEP       the train loss is NaN at STEP: the trial diverges
    STUDYRUNNER_INJECT_DRIVER_KILL=GLOB@finish
                                           the submitting process SIGKILLs itself while recording the
                                           trial's end: after the ledger has its outcome, before MLflow
    STUDYRUNNER_INJECT_DRIVER_KILL=GLOB@look
                                           ... right after a sequential study's look is recorded with
                                           the next wave's trials (GLOB matches one of them), before
                                           any of them is leased or run

Read by the driver, which passes each trial's faults in its payload (workers on other nodes do not
share the driver's environment).
"""

from __future__ import annotations

import fnmatch
import os
import signal

from ...errors import StudyrunnerError

KINDS = {"STUDYRUNNER_INJECT_KILL": "kill_at", "STUDYRUNNER_INJECT_NAN": "nan_at"}


def _rules(variable: str) -> list[tuple[str, int]]:
    rules = []
    for item in filter(None, (p.strip() for p in os.environ.get(variable, "").split(","))):
        pattern, _, step = item.rpartition("@")
        if not pattern or not step.isdigit():
            raise StudyrunnerError(f"{variable}={item!r}: expected TRIAL_KEY_GLOB@STEP, e.g. 'mystudy-*-s0@5'")
        rules.append((pattern, int(step)))
    return rules


def fault_injected(trial_key: str) -> bool:
    """Does STUDYRUNNER_INJECT_FAULT name this trial (a code error at start)?"""
    patterns = filter(None, (p.strip() for p in os.environ.get("STUDYRUNNER_INJECT_FAULT", "").split(",")))
    return any(fnmatch.fnmatchcase(trial_key, p) for p in patterns)


def injections_for(trial_key: str) -> dict[str, int] | None:
    """{'kill_at': step, 'nan_at': step} for the faults the environment injects into this trial."""
    found = {}
    for variable, name in KINDS.items():
        for pattern, step in _rules(variable):
            if fnmatch.fnmatchcase(trial_key, pattern):
                found[name] = step
    return found or None


DRIVER_POINTS = ("finish", "look")


def driver_kills() -> list[tuple[str, str]]:
    """(trial key glob, point) pairs of STUDYRUNNER_INJECT_DRIVER_KILL; a bad value is one line."""
    rules = []
    for item in filter(None, (p.strip() for p in os.environ.get("STUDYRUNNER_INJECT_DRIVER_KILL", "").split(","))):
        pattern, _, point = item.rpartition("@")
        if not pattern or point not in DRIVER_POINTS:
            raise StudyrunnerError(
                f"STUDYRUNNER_INJECT_DRIVER_KILL={item!r}: expected TRIAL_KEY_GLOB@POINT, POINT one of {DRIVER_POINTS}"
            )
        rules.append((pattern, point))
    return rules


def kill_driver_at(point: str, trial_key: str) -> None:
    """SIGKILL this (the submitting) process if STUDYRUNNER_INJECT_DRIVER_KILL names `trial_key` at `point`."""
    if any(at == point and fnmatch.fnmatchcase(trial_key, pattern) for pattern, at in driver_kills()):
        os.kill(os.getpid(), signal.SIGKILL)
