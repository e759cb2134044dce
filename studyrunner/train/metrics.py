"""Names of the metrics the trainer itself reports for every trial (tasks and families add theirs)."""

from .flops import FLOP_METRICS

TRAINER_METRICS = frozenset(
    {"train_loss", "lr", "step_time_ms", "tokens_per_sec", "train_time_s", "params", "effective_depth", "weights_bytes"}
    | set(FLOP_METRICS)
)
