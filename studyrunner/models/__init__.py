"""Model families on one shared transformer core. Importing this package registers every family."""

from . import adaptive_layers, looped, loopformer, looplm, melt, ut_act  # noqa: F401  (registration side effect)
from .output import ModelOutput
from .registry import FAMILIES, build_model, count_params, get_family, register_family

__all__ = ["FAMILIES", "ModelOutput", "build_model", "count_params", "get_family", "register_family"]
