"""Numerics the engine and the learner must agree on: dtype names and "auto", fp32 logits."""
