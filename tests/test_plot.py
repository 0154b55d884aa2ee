"""python -m asyncrl.plot: a PNG of a run's curves from metrics.jsonl + eval.jsonl, --compare, and one-line
refusals (exit 2) when there is nothing to plot."""

import json
import math
import subprocess
import sys

import pytest

from asyncrl.plot.__main__ import main
from asyncrl.plot.evals import last_eval, read_evals
from asyncrl.plot.run_data import load_run

pytest.importorskip("matplotlib")


def make_run(path, steps=20, eval_steps=None, reward0=0.2, eval_file=True, seconds_per_step=3.0):
    """A small run directory: config.json, one metrics line per step, an eval result at each of eval_steps
    (in eval.jsonl, and merged into the next step's metrics line as the learner does)."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model": {"path": "/models/Qwen2.5-0.5B-Instruct"},
                                                  "task": {"name": "gsm8k"}, "learner": {"algorithm": "grpo"},
                                                  "batch": {"prompts_per_step": 8, "samples_per_prompt": 8}}))
    eval_steps = (0, steps // 2, steps) if eval_steps is None else eval_steps
    learned = [1 - math.exp(-s / (steps / 3)) for s in range(steps + 1)]  # 0 -> 0.95: a saturating curve
    evals = [{"step": s, "pass@1": 0.19 + 0.45 * learned[s], "mean@k": 0.12 + 0.4 * learned[s], "k": 8,
              "pass@k": 0.43 + 0.4 * learned[s],
              "prompts": 64, "time_s": s * seconds_per_step + 1.0, "response_tokens": 140.0 - 40 * learned[s],
              "versions": [s, s], "check": "math_verify"} for s in eval_steps]
    lines = []
    for step in range(1, steps + 1):
        m = {"step": step, "reward_mean": reward0 + 0.5 * learned[step] + 0.06 * math.sin(7 * step), "loss": 0.1,
             "kl": 1e-3 + 2e-2 * learned[step], "behav_prox_logp_absdiff": 8e-3 + 1e-3 * math.sin(step),
             "behav_prox_logp_absdiff_p99": 5e-2 + 5e-3 * math.sin(3 * step),
             "response_len_mean": 150.0 - 50 * learned[step] + 5 * math.sin(5 * step),
             "step_time_s": 2.5 + 0.3 * (step % 3 == 0), "time_s": step * seconds_per_step}
        done = [e for e in evals if step - 1 <= e["step"] < step]  # arrived during this step
        if done:
            m["eval"] = done[-1]
        lines.append(json.dumps(m))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    if eval_file:
        (path / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    return path


def decodes(png):
    import matplotlib.image

    img = matplotlib.image.imread(png)
    return img.ndim == 3 and img.shape[0] > 500 and img.shape[1] > 500


def test_a_run_dir_becomes_one_png_in_it(tmp_path, capsys):
    run = make_run(tmp_path / "run-a")
    assert main([str(run)]) == 0
    png = run / "curves.png"
    assert capsys.readouterr().out.strip() == str(png)
    assert png.stat().st_size > 10_000 and decodes(png)


def test_compare_and_one_x_axis(tmp_path, capsys):
    a, b = make_run(tmp_path / "run-a"), make_run(tmp_path / "run-b", reward0=0.1, seconds_per_step=5.0)
    out = tmp_path / "out" / "ab.png"
    assert main([str(a), "-o", str(out), "--compare", str(b), "--x", "time"]) == 0
    assert out.stat().st_size > 10_000 and decodes(out)


def test_nothing_to_plot_is_one_line_and_exit_2(tmp_path, capsys):
    assert main([str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty")]) == 2
    assert "no metrics.jsonl" in capsys.readouterr().err
    (tmp_path / "empty" / "metrics.jsonl").write_text("")
    assert main([str(tmp_path / "empty")]) == 2
    err = capsys.readouterr().err
    assert "no step yet" in err and err.count("\n") == 1
    a = make_run(tmp_path / "run-a")
    assert main([str(a), "--compare", str(tmp_path / "nope")]) == 2


def test_as_a_module_in_a_subprocess(tmp_path):
    run = make_run(tmp_path / "run-a")
    out = tmp_path / "c.png"
    done = subprocess.run([sys.executable, "-m", "asyncrl.plot", str(run), "-o", str(out), "--x", "step"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(out) and out.stat().st_size > 10_000
    missing = subprocess.run([sys.executable, "-m", "asyncrl.plot", str(tmp_path / "nope")], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1


def test_without_matplotlib_it_says_how_to_install(tmp_path, monkeypatch, capsys):
    run = make_run(tmp_path / "run-a")
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "asyncrl.plot.figure", raising=False)
    assert main([str(run)]) == 2
    assert "pip install asyncrl[plot]" in capsys.readouterr().err


def test_evals_come_from_eval_jsonl_else_from_metrics_lines(tmp_path):
    a = make_run(tmp_path / "a")
    b = make_run(tmp_path / "b", eval_file=False)
    assert [e["step"] for e in read_evals(a)] == [0, 10, 20]
    assert [e["step"] for e in read_evals(b)] == [0, 10]  # step 20's result arrived after the last step line
    assert last_eval(a)["step"] == 20 and last_eval(b) is None


def test_a_resumed_run_keeps_the_last_line_of_a_step_and_wall_time_grows(tmp_path):
    run = make_run(tmp_path / "a", steps=4)
    with open(run / "metrics.jsonl", "a") as f:  # resumed from step 2's checkpoint: its clock restarts at 0
        for step, t in ((3, 2.0), (4, 4.0)):
            f.write(json.dumps({"step": step, "reward_mean": 0.9, "time_s": t}) + "\n")
    r = load_run(run)
    assert [m["step"] for m in r.steps] == [1, 2, 3, 4] and r.column("reward_mean")[2:] == [0.9, 0.9]
    assert r.wall_s() == [3.0, 6.0, 8.0, 10.0]
    assert r.title == "a: model Qwen2.5-0.5B-Instruct, task gsm8k, grpo, 8x8 per step"


def test_the_eval_panel_has_pass_at_1_mean_at_k_and_pass_at_k(tmp_path):
    from asyncrl.plot.figure import panels

    run = load_run(make_run(tmp_path / "run"))
    (evals,) = [p for p in panels([run]) if p.title == "held-out eval"]
    assert [s.label for s in evals.series] == ["pass@1 (greedy)", "mean@8", "pass@8 (one of 8 right)"]
    learned = [0.0, 1 - math.exp(-1.5), 1 - math.exp(-3)]  # make_run's curve at its three evaluated steps
    assert evals.series[2].y(run) == pytest.approx([0.43 + 0.4 * x for x in learned])


def test_a_multi_turn_run_gets_a_tool_calls_panel_and_others_do_not(tmp_path):
    """Tool calls per trained episode = the batch's tool_calls over samples_trained; the eval's greedy rate beside."""
    from asyncrl.plot.figure import calls_per_episode, panels

    plain = load_run(make_run(tmp_path / "plain"))
    assert "tool calls per episode" not in [p.title for p in panels([plain])]
    path = make_run(tmp_path / "tools", steps=4, eval_steps=(0, 4))
    lines = [json.loads(x) for x in (path / "metrics.jsonl").read_text().splitlines()]
    for m, calls in zip(lines, (0, 8, 32, 64)):
        m.update(tool_calls=calls, samples_trained=64)
    (path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    evals = [json.loads(x) for x in (path / "eval.jsonl").read_text().splitlines()]
    evals[1]["tool_calls_mean"] = 1.0
    (path / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    run = load_run(path)
    (tools,) = [p for p in panels([run]) if p.title == "tool calls per episode"]
    assert calls_per_episode(run) == [0.0, 0.125, 0.5, 1.0]
    eval_series = [s for s in tools.series if s.evals]
    assert math.isnan(eval_series[0].y(run)[0]) and eval_series[0].y(run)[1] == 1.0
    assert main([str(path)]) == 0
