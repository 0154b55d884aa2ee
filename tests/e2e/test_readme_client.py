"""The README's client example, exactly as written, against hub + generator + reward worker of the
embedded default (real processes on CPU): it prints a reward for every sample, none failed."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from asyncrl import Client
from e2e_helpers import make_run, shutdown, start

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_client_snippet() -> str:
    """The first python block after "Submit prompts to a running system"."""
    text = README.read_text()
    section = text[text.index("Submit prompts to a running system"):]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "README: no python block under 'Submit prompts to a running system'"
    return match.group(1)


def test_readme_client_example_prints_rewards(tmp_path):
    snippet = readme_client_snippet()
    assert 'run_dir="runs/…"' in snippet, "the README example changed: update this test's run_dir substitution"
    cfg, run_dir, endpoints = make_run(tmp_path, [])
    children = start(run_dir, endpoints, ["replay", "generator-0", "reward-0"])
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(snippet.replace("runs/…", str(run_dir)), {})  # noqa: S102 - the README's own code
        with Client(run_dir=run_dir) as client:
            accounting = client.stats()["accounting"]
    finally:
        logs = shutdown(children)
    lines = out.getvalue().splitlines()
    assert len(lines) == 4, f"{out.getvalue()!r}\n{logs}"
    rewards = [float(line.rsplit(" ", 1)[1]) for line in lines]
    assert set(rewards) <= {0.0, 1.0}, lines
    assert accounting["submitted"] == 4 and accounting["failed"] == 0 and accounting["lost"] == 0, accounting
