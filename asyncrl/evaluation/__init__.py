"""Held-out evaluation: during training through the live generators (`LiveEvaluator`), or on its own for a
checkpoint or export (`python -m asyncrl.eval`, the program in asyncrl/eval/)."""

from asyncrl.evaluation.config import EvalConfig

__all__ = ["EvalConfig"]
