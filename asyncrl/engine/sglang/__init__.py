"""Adapter that drives an SGLang server (HTTP) through the engine protocol; see docs/sglang.md."""
