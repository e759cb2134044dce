"""Study files: schema, loading and compilation into cells and trials."""

from .canonical import canonical_json, config_hash, flatten_config, trial_key
from .compiled import Cell, CompiledStudy, Trial
from .compiler import compile_study
from .loader import load, loads
from .schema import Study


def load_and_compile(path) -> CompiledStudy:
    return compile_study(load(path))


__all__ = [
    "Cell",
    "CompiledStudy",
    "Study",
    "Trial",
    "canonical_json",
    "compile_study",
    "config_hash",
    "flatten_config",
    "load",
    "load_and_compile",
    "loads",
    "trial_key",
]
