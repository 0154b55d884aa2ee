"""bench.logprob_agreement --weights-dtype fp8 on CPU (tiny shape): one run per --fp8-keep set, each against the
same scorer; keeping every projection in the model dtype gives the model-dtype engine's numbers exactly, and fp8
weights move them."""

import json
import sys

import pytest

from bench import logprob_agreement


def run_bench(monkeypatch, capsys, *extra: str) -> dict:
    argv = ["bench.logprob_agreement", "--shape", "tiny", "--prompts", "4", "--prompt-len", "16", "--output-len", "16",
            *extra]
    monkeypatch.setattr(sys, "argv", argv)
    logprob_agreement.main()
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_each_keep_set_is_a_run_and_keeping_all_is_the_model_dtype_engine(monkeypatch, capsys):
    row = run_bench(monkeypatch, capsys, "--weights-dtype", "fp8",
                    "--fp8-keep", "none,down_proj,qkv+o_proj+gate_up+down_proj")
    runs, every = row["runs"], "fp8-keep-qkv-keep-o_proj-keep-gate_up-keep-down_proj"
    assert list(runs) == ["model_dtype", "fp8", "fp8-keep-down_proj", every]
    assert runs[every] == runs["model_dtype"]  # no fp8 matmul left
    assert runs["fp8"]["mean_abs_delta"] != runs["model_dtype"]["mean_abs_delta"]
    assert runs["fp8-keep-down_proj"]["mean_abs_delta"] != runs["fp8"]["mean_abs_delta"]


def test_an_unknown_projection_is_refused(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        run_bench(monkeypatch, capsys, "--weights-dtype", "fp8", "--fp8-keep", "none,lm_head")
    assert "--fp8-keep lm_head: allowed: qkv, o_proj, gate_up, down_proj or none" in capsys.readouterr().err
