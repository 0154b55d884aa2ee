"""`python -m asyncrl.eval` (asyncrl.evaluation.offline) on the embedded model: single-turn configs score each
response, multi-turn configs run whole episodes through the generator's rollout seam and score the model's last
turn only, failed episodes are counted, and a bad config is one line and exit 2."""

from __future__ import annotations

import json
import textwrap

from asyncrl.eval.__main__ import main

REVEAL = textwrap.dedent('''
    from asyncrl.rollout.environment import Observation, Step


    class Reveal:
        """After each model turn the environment writes the right answer."""

        def __init__(self, **options):
            pass

        def reset(self, task):
            self.target = task.target.strip()
            return None

        def step(self, action):
            return Step(observation=Observation(text=" " + self.target))
''')


def run(capsys, *args: str) -> dict:
    assert main(list(args)) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_single_turn_scores_every_held_out_prompt(capsys):
    record = run(capsys, "embedded", "--prompts", "40", "--k", "2")
    assert record["prompts"] == 40 and record["missing"] == 0 and record["k"] == 2
    assert record["pass@1"] >= 0.8  # the embedded model solves ~94 % of its own task greedily
    assert "turns_mean" not in record


def test_multi_turn_runs_episodes_against_the_environment(capsys):
    record = run(capsys, "embedded", "configs/multiturn-cpu.toml", "--prompts", "40", "--k", "4")
    assert record["missing"] == 0
    assert record["turns_mean@k"] > 1.0  # sampled wrong answers got the problem again (RetryArithmetic)
    assert record["tool_calls_mean"] == 0.0


def test_multi_turn_continues_after_each_observation(capsys, tmp_path, monkeypatch):
    (tmp_path / "reveal_env.py").write_text(REVEAL)
    monkeypatch.syspath_prepend(str(tmp_path))
    record = run(capsys, "embedded", "configs/multiturn-cpu.toml", "--prompts", "20",
                 "--set", "generator.rollout.environment=reveal_env:Reveal", "--set", "generator.rollout.max_turns=2")
    assert record["missing"] == 0 and record["episodes_failed"] == 0
    assert record["turns_mean"] == 2.0  # every episode: the model, the environment's answer, the model again


def test_a_bad_config_is_one_line_and_exit_2(capsys):
    assert main(["embedded", "--set", "task.nosuch=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "task.nosuch" in err[0]


def test_failed_episodes_are_counted(capsys, tmp_path, monkeypatch):
    (tmp_path / "broken_env.py").write_text(REVEAL.replace("self.target = task.target.strip()", "raise OSError('down')"))
    monkeypatch.syspath_prepend(str(tmp_path))
    record = run(capsys, "embedded", "configs/multiturn-cpu.toml", "--prompts", "10",
                 "--set", "generator.rollout.environment=broken_env:Reveal")
    assert record["episodes_failed"] == 10 and record["pass@1"] == 0.0
