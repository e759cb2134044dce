"""The environment variables studyrunner reads as settings, each parsed here, and `check()`, which refuses a
bad value in one line naming the variable. The commands that train run `check()` before they write anything
or start Ray, so a typo never leaves a study half-registered.

An empty value means unset (`VAR= studyrunner ...` is a usual way to unset a variable for one command)."""

from __future__ import annotations

import os

from .errors import StudyrunnerError, UsageError

ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _raw(name: str) -> str:
    return os.environ.get(name, "").strip()


def switch(name: str, default: bool) -> bool:
    """An on/off variable: 1/true/yes/on or 0/false/no/off (any case); unset or empty: `default`."""
    value = _raw(name).lower()
    if not value:
        return default
    if value not in ON + OFF:
        raise UsageError(
            f"{name}={value!r} is neither on nor off: set it to 1 or 0 (or leave it unset: {'1' if default else '0'})"
        )
    return value in ON


def seconds(name: str, default: float, *, positive: bool = False) -> float:
    """A duration in seconds (a number >= 0, or > 0 with `positive`); unset or empty: `default`."""
    value = _raw(name)
    if not value:
        return default
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if not number == number or number < 0 or (positive and number == 0) or number == float("inf"):
        raise UsageError(
            f"{name}={value!r} is not a number of seconds {'above' if positive else 'at least'} 0 "
            f"(e.g. {default:g}, the default when it is unset)"
        )
    return number


def seconds_or_default(name: str, default: float, *, positive: bool = False) -> float:
    """`seconds`, for a value read when a module is imported: a bad one reads as the default there, and
    `check()` refuses it before a command does anything."""
    try:
        return seconds(name, default, positive=positive)
    except StudyrunnerError:
        return default


# Every setting a command that trains reads, with its default: `check()` reads each once.
SWITCHES = {"STUDYRUNNER_WARM_WORKERS": True, "STUDYRUNNER_PREFETCH": None}
DURATIONS = {"STUDYRUNNER_STALE_AFTER": 60.0, "STUDYRUNNER_HEARTBEAT": 5.0, "STUDYRUNNER_STOP_GRACE": 30.0}


def check() -> None:
    """Refuse, in one line, the first setting whose value is not one its variable takes."""
    for name, default in SWITCHES.items():
        switch(name, bool(default))
    for name, default in DURATIONS.items():
        seconds(name, default, positive=name != "STUDYRUNNER_STALE_AFTER")
