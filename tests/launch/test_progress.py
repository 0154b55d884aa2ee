"""The progress line (elapsed, steps/s, ETA, no 'nan' before the first step, the latest eval) and the final human
summary (first and last eval too)."""

import json

from launch.progress import Progress, StepRate, progress_row
from launch.report import duration, eval_line, final_report


def test_before_the_first_step_nothing_is_nan():
    row = progress_row({}, {}, total=20, elapsed_s=5.0, rate=None)
    assert "nan" not in " ".join(row.values())
    assert row["reward"] == "-" and row["eta"] == "-" and row["steps/s"] == "-" and row["elapsed"] == "5s"
    assert row["logp mismatch"] == "-"


def test_the_logprob_mismatch_is_shown_as_mean_and_p99():
    m = {"step": 3, "behav_prox_logp_absdiff": 0.00123, "behav_prox_logp_absdiff_p99": 0.0151}
    assert progress_row(m, {}, total=20, elapsed_s=5.0, rate=None)["logp mismatch"] == "1.2e-03 (p99 1.5e-02)"


def test_eta_is_the_steps_left_at_the_observed_rate():
    rate = StepRate()
    assert rate.observe(3, now=100.0) is None  # the first step seen only starts the clock (a resumed run)
    r = rate.observe(8, now=110.0)
    assert r == 0.5
    row = progress_row({"step": 8, "reward_mean": 0.25}, {}, total=20, elapsed_s=75.0, rate=r)
    assert row["eta"] == "24s" and row["steps/s"] == "0.500" and row["reward"] == "0.250" and row["elapsed"] == "1m15s"


def test_duration_formats():
    assert (duration(0.4), duration(73), duration(3723)) == ("0s", "1m13s", "1h02m03s")


def test_final_report_has_elapsed_reward_first_to_last_samples_lost_and_export(tmp_path):
    rows = [{"step": 1, "reward_mean": 0.125}, {"step": 2, "reward_mean": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "export").mkdir()
    text = final_report(tmp_path, {"submitted": 160, "trained": 128, "failed": 0, "dropped_stale": 0, "lost": 0},
                        elapsed_s=151, total_steps=2, outcome="finished")
    assert "run finished in 2m31s: step 2/2, reward 0.125 -> 0.500" in text
    assert "128 trained of 160 submitted" in text and "0 lost" in text and "filtered" not in text
    assert f"model: {tmp_path / 'export'}" in text
    refill = final_report(tmp_path, {"submitted": 176, "trained": 128, "filtered": 16, "lost": 0}, 151, 2, "finished")
    assert "16 filtered (groups without signal, refill), 0 lost" in refill


def test_final_report_counts_client_prompts_apart(tmp_path):
    acc = {"submitted": 170, "trained": 128, "failed": 0, "dropped_stale": 0, "lost": 0, "client_submitted": 10,
           "client_failed": 2}
    text = final_report(tmp_path, acc, elapsed_s=5, total_steps=2, outcome="finished")
    assert "0 failed" in text and "client prompts: 10 submitted, 2 failed" in text
    plain = final_report(tmp_path, {**acc, "client_submitted": 0, "client_failed": 0}, 5, 2, "finished")
    assert "client prompts" not in plain


def test_final_report_without_steps_or_accounting(tmp_path):
    text = final_report(tmp_path, {"error": "the hub did not answer"}, elapsed_s=3, total_steps=5, outcome="failed")
    assert "no step finished" in text and "the hub did not answer" in text and "not exported" in text


def test_the_progress_line_shows_the_latest_eval(tmp_path):
    assert progress_row({"step": 3}, {}, total=20, elapsed_s=5.0, rate=None)["eval"] == "-"
    ev = {"step": 40, "pass@1": 0.3125, "mean@k": 0.25, "k": 8}
    assert progress_row({"step": 42}, {}, 200, 5.0, None, latest_eval=ev)["eval"] == "pass@1 0.31 @ step 40"
    progress = Progress(tmp_path, total_steps=200, enabled=False)
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 12, "eval": {"step": 10, "pass@1": 0.2}}) + "\n")
    progress.update({})
    assert progress.latest_eval["step"] == 10  # no eval.jsonl: the "eval" a metrics line carried
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 13}) + "\n")
    progress.update({})
    assert progress.latest_eval["step"] == 10  # kept while later lines carry none
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps({"step": s, "pass@1": 0.1 * s}) + "\n" for s in (10, 20)))
    progress.update({})
    assert progress.latest_eval["step"] == 20


def test_final_report_shows_the_first_and_last_eval(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 200, "reward_mean": 0.7}) + "\n")
    evals = [{"step": s, "pass@1": p, "mean@k": m, "k": 8, "prompts": 64, "time_s": 1.0 * s}
             for s, p, m in ((0, 0.19, 0.125), (100, 0.5, 0.4), (200, 0.63, 0.5))]
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    text = final_report(tmp_path, {"submitted": 1, "lost": 0}, elapsed_s=60, total_steps=200, outcome="finished")
    assert "eval pass@1 0.19 -> 0.63 at step 200, mean@8 0.12 -> 0.50 (from step 0, 64 prompts)" in text.splitlines()
    assert eval_line(evals[0], evals[0]) == "eval pass@1 0.19 at step 0, mean@8 0.12 (64 prompts)"
    no_k = {"step": 10, "pass@1": 0.25}
    assert eval_line(no_k, no_k) == "eval pass@1 0.25 at step 10"
    (tmp_path / "eval.jsonl").unlink()
    assert "eval" not in final_report(tmp_path, {"submitted": 1}, 60, 200, "finished").split("\n")[1]
