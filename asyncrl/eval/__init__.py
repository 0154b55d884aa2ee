"""`python -m asyncrl.eval`: the command that evaluates a model folder on its own. A program, like services/: it
reads a run's whole TOML; the evaluation itself is the library `asyncrl.evaluation`."""
