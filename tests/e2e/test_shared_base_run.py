"""generator.share_base through the launcher on CPU (its own file, so that it runs beside test_learning_loop.py's
long tests rather than after them)."""

from __future__ import annotations

import pytest
from e2e_helpers import launch, metrics, summary

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def test_lora_on_one_shared_base_image_trains_and_the_holder_cleans_up_last(tmp_path):
    """generator.share_base through the launcher: the base holder writes the image before the learner and the
    generator map it (each logs that it holds none of its matrices), the run trains and accounts for every sample,
    and the holder, stopped last, removes the image."""
    run_dir = tmp_path / "run"
    proc = launch(run_dir, "learner.lora_rank=8", "generator.lora_apply=unmerged", "generator.share_base=true",
                  "learner.steps=4")
    assert proc.returncode == 0, proc.output
    assert len(metrics(run_dir)) == 4 and summary(run_dir)["accounting"]["lost"] == 0
    logs = {name: (run_dir / "logs" / f"{name}.log").read_text() for name in ("base-holder", "learner-0", "generator-0")}
    assert "base image: 15 matrices" in logs["base-holder"]
    assert all("shared image" in logs[n] or "shared base image" in logs[n] for n in ("learner-0", "generator-0"))
    assert not any((run_dir / "shared_base").iterdir())
