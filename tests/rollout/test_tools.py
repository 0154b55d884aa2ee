"""The tool environment's parts: the calculator, the Python sandbox, ToolUse and RetryTask."""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np
import pytest

from asyncrl.rollout.calculator import CalculatorError, calculate
from asyncrl.rollout.environment import Action, Task
from asyncrl.rollout.envs.retry_task import RetryTask
from asyncrl.rollout.envs.tool_use import ToolUse
from asyncrl.rollout.sandbox import SandboxLimits, SandboxUnavailable, run_python


def sandbox_works() -> bool:
    try:
        return run_python("print(1)").stdout.strip() == "1"
    except SandboxUnavailable:
        return False


needs_sandbox = pytest.mark.skipif(shutil.which("unshare") is None or not sandbox_works(),
                                   reason="no user namespaces here")


def test_calculator():
    assert calculate("37 * 48") == "1776" and calculate("-(3 - 10) / 2") == "3.5" and calculate("2**10") == "1024"
    for bad in ["__import__('os')", "x + 1", "2 ** 1000", "1 / 0", "(1).real", "9" * 300]:
        with pytest.raises(CalculatorError):
            calculate(bad)


@needs_sandbox
def test_sandbox_runs_code_and_keeps_its_output():
    r = run_python("import sys; print(sum(range(10))); print('e', file=sys.stderr)")
    assert r.stdout.strip() == "45" and r.exit_code == 0 and not r.timed_out and r.summary() == "45"


@needs_sandbox
def test_sandbox_has_no_network():
    r = run_python("import socket\ns = socket.socket(); s.settimeout(1)\nprint(s.connect_ex(('127.0.0.1', 22)))")
    assert r.exit_code == 0 and r.stdout.strip() != "0"  # unreachable: no interface is up in its namespace


@needs_sandbox
def test_sandbox_cannot_write_outside_its_temp_dir(tmp_path):
    target = tmp_path / "escape.txt"
    r = run_python(f"open('inside.txt', 'w').write('ok')\nopen({str(target)!r}, 'w').write('no')")
    assert r.exit_code != 0 and "Read-only file system" in r.stderr and not target.exists()


@needs_sandbox
def test_sandbox_kills_at_the_time_limit():
    r = run_python("while True: pass", SandboxLimits(wall_s=1.0, cpu_s=30))
    assert r.timed_out and r.exit_code is None
    left = subprocess.run(["pgrep", "-f", "asyncrl-sandbox-"], capture_output=True, text=True).stdout.split()
    assert str(os.getpid()) not in left and not left


@needs_sandbox
def test_sandbox_memory_limit():
    r = run_python("x = bytearray(2 << 30)", SandboxLimits(memory_mb=256))
    assert r.exit_code != 0 and "MemoryError" in r.stderr


def task(target="1776") -> Task:
    return Task(prompt_id="p", token_ids=np.zeros(1, np.int32), text=None, target=target, params={},
                metadata={}, sample_index=0)


def act(text, turn=1, version=0) -> Action:
    return Action(text=text, token_ids=np.zeros(1, np.int32), finish_reason="stop", turn=turn, version=version)


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "37*48"}}</tool_call>'
BAD_CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "37*"}}</tool_call>'



def test_tool_use_runs_the_call_and_scores_the_final_answer():
    env = ToolUse()
    env.reset(task())
    step = env.step(act('<tool_call>{"name": "calculator", "arguments": {"expression": "37*48"}}</tool_call>'))
    assert step.tool_calls == 1 and not step.done
    assert step.observation.message == {"role": "tool", "content": "<tool_response>1776</tool_response>"}
    assert env.step(act("37 * 48 = 1776", 2)).reward == 1.0
    assert env.step(act("37 * 48 = 1775", 2)).reward == 0.0


def test_tool_use_answers_bad_calls_with_an_error_the_model_reads():
    env = ToolUse()
    env.reset(task())
    bomb = "[" * 5000 + "]" * 5000  # nested deeper than the JSON parser goes
    step = env.step(act('<tool_call>{"name": "shell", "arguments": {}}</tool_call><tool_call>nope</tool_call>'
                        f"<tool_call>{bomb}</tool_call>"))
    assert step.tool_calls == 3 and step.observation.message["content"].count("error:") == 3
    with pytest.raises(ValueError, match="unknown"):
        ToolUse(tools=["shell"])


def test_no_reward_for_calling_by_default():
    env = ToolUse()
    env.reset(task())
    step = env.step(act(CALL))
    assert step.reward == 0.0 and step.info == {"tool_errors": 0.0}


def test_call_reward_pays_the_first_working_call_once_and_decays_to_zero_by_version():
    env = ToolUse(call_reward=0.2, call_reward_until=100)
    rewards = {}
    for version in (0, 25, 50, 100, 150):
        env.reset(task())
        failed = env.step(act(BAD_CALL, version=version))  # the tool refuses it: no reward for a broken call
        assert failed.reward == 0.0 and failed.info == {"tool_errors": 1.0}
        rewards[version] = env.step(act(CALL, turn=2, version=version)).reward
        assert env.step(act(CALL, turn=3, version=version)).reward == 0.0  # once an episode
        assert env.step(act("1776", turn=4, version=version)).reward == 1.0  # the answer's reward is unchanged
    assert rewards == pytest.approx({0: 0.2, 25: 0.15, 50: 0.1, 100: 0.0, 150: 0.0})


@pytest.mark.parametrize("kwargs, match", [
    ({"call_reward": 0.2}, "call_reward_until=0: call_reward needs the weight version"),
    ({"call_reward": 0.2, "call_reward_until": -5}, "call_reward_until=-5"),
    ({"call_reward": 1.5, "call_reward_until": 10}, r"call_reward=1.5: must be in \[0, 1\]"),
])
def test_call_reward_is_checked_with_the_option_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ToolUse(**kwargs)


def test_retry_task_gives_feedback_then_discounts():
    env = RetryTask(discount=0.5)
    env.reset(task("12"))
    wrong = env.step(act("It is 11."))
    assert wrong.observation.message["content"].startswith("That is not") and not wrong.done
    assert env.step(act("It is 12.", turn=2)).reward == 0.5
