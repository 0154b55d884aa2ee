"""Training curves of a run directory as one PNG: `python -m asyncrl.plot RUN_DIR` (docs/plot.md).

    evals.py     held-out eval results of a run (eval.jsonl, else the "eval" keys of metrics.jsonl); no matplotlib
    run_data.py  one run's metrics lines, eval results and title, read from its directory; no matplotlib
    figure.py    the panels, drawn with matplotlib (Agg)
    __main__.py  the command line
"""
