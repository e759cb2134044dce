"""studyrunner: declarative ablation and scaling studies of looped transformers."""

__version__ = "0.1.0"
