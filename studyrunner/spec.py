"""Deprecated alias of :mod:`studyrunner.study`, which this package was called before 0.2.

`studyrunner/spec/` was renamed because tools that follow the RSpec convention take a `spec/` folder for
tests. Imports of `studyrunner.spec` and its submodules keep working for this release, with a
DeprecationWarning, and will be removed in the next one.
"""

import importlib
import sys
import warnings

from .study import *  # noqa: F403
from .study import __all__  # noqa: F401

warnings.warn(
    "studyrunner.spec is now studyrunner.study; the old name goes in the next release",
    DeprecationWarning,
    stacklevel=2,
)

for _name in (
    "baselines",
    "checks",
    "claims_check",
    "claims_grammar",
    "compiler",
    "errors",
    "extension",
    "feasibility",
    "jsonschema",
    "knobs",
    "loader",
    "schema",
    "search",
):
    sys.modules[f"{__name__}.{_name}"] = importlib.import_module(f"studyrunner.study.{_name}")
