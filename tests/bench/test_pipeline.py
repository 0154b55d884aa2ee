"""bench.pipeline: modes interleaved, medians per mode over repeats, run directories removed unless --keep."""

import json

import pytest

import bench.pipeline as bp


def fake_result(steps_per_s: float, steady: float) -> dict:
    return {"steps": 4, "wall_s": 4 / steps_per_s, "steps_per_s": steps_per_s, "steady_step_s": steady,
            "span_s": {"train": {"median": steady / 2, "max": steady, "count": 4}},
            "overlap_fraction": 0.5, "generator_idle_fraction": 0.1, "learner_idle_fraction": 0.2,
            "staleness_hist": {0: 2, 1: 2}, "push_s_per_step": {"send_s": 0.01},
            "reward_first": 0.1, "reward_last": 0.4, "_spans": {"learner": [], "generator": [], "t0": 0.0},
            "_timeline": [["learner-0", "train", 0.0, steady / 2]]}


@pytest.fixture
def fake_runs(monkeypatch):
    """run_mode records its order and makes the directory; analyse returns numbers that depend on the order."""
    calls: list[tuple[str, str]] = []
    per_mode = {"async": [1.0, 3.0, 2.0], "sync": [0.5, 0.7, 0.6]}

    def run_mode(config, overrides, run_dir, stop_after=0):
        run_dir.mkdir(parents=True)
        calls.append((run_dir.name, overrides[-1]))

    def analyse(run_dir):
        mode, r = run_dir.name.split("-")
        rate = per_mode[mode][int(r)]
        return fake_result(rate, 1 / rate)

    monkeypatch.setattr(bp, "run_mode", run_mode)
    monkeypatch.setattr(bp, "analyse", analyse)
    return calls


def test_runs_interleave_and_report_medians_and_clean_up(fake_runs, capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(bp.tempfile, "tempdir", str(tmp_path))
    bp.main(["--repeats", "3"])
    assert [c[0] for c in fake_runs] == ["async-0", "sync-0", "async-1", "sync-1", "async-2", "sync-2"]
    assert [c[1] for c in fake_runs][:2] == ["hub.max_staleness=1", "hub.max_staleness=0"]
    line = json.loads(capsys.readouterr().out)
    assert line["async_steps_per_s"] == 2.0 and line["sync_steps_per_s"] == 0.6
    assert line["steady_step_s"] == {"async": 0.5, "sync": pytest.approx(1 / 0.6)}
    assert line["span_s"]["async"]["train"]["median"] == 0.25
    assert line["staleness_hist"]["async"] == {"0": 6, "1": 6} and line["repeats"] == 3
    assert list(tmp_path.iterdir()) == []  # run directories removed


def test_keep_leaves_the_run_directories(fake_runs, capsys, tmp_path):
    bp.main(["--repeats", "1", "--keep", str(tmp_path / "kept")])
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == ["async-0", "sync-0"]
    assert json.loads(capsys.readouterr().out)["run_dirs"] == str(tmp_path / "kept")


def test_timeline_file_holds_the_first_run_of_each_mode(fake_runs, capsys, tmp_path):
    path = tmp_path / "timeline.json"
    bp.main(["--repeats", "2", "--keep", str(tmp_path / "kept"), "--timeline", str(path)])
    got = json.loads(path.read_text())
    assert got == {"async": [["learner-0", "train", 0.0, 0.5]], "sync": [["learner-0", "train", 0.0, 1.0]]}
    assert json.loads(capsys.readouterr().out)["timeline"] == str(path)


def test_relative_spans_are_in_time_order_from_the_first():
    spans = [{"name": "generator-0", "kind": "generate", "start": 12.0, "end": 13.5},
             {"name": "learner-0", "kind": "train", "start": 10.0, "end": 11.0}]
    assert bp.relative_spans(spans, 10.0) == [["learner-0", "train", 0.0, 1.0], ["generator-0", "generate", 2.0, 3.5]]


def test_a_failed_run_still_removes_the_directories(monkeypatch, tmp_path):
    monkeypatch.setattr(bp.tempfile, "tempdir", str(tmp_path))

    def failing(config, overrides, run_dir, stop_after=0):
        run_dir.mkdir(parents=True)
        raise SystemExit("bench.pipeline: the run failed")

    monkeypatch.setattr(bp, "run_mode", failing)
    with pytest.raises(SystemExit):
        bp.main([])
    assert list(tmp_path.iterdir()) == []


def test_gpu_only_benches_say_so_on_cpu(monkeypatch, capsys):
    from bench.generation import require_cuda

    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as e:
        require_cuda("bench.logprob_agreement")
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a GPU" in err


def test_span_medians_keep_the_final_checkpoint_apart():
    from bench.pipeline import span_medians

    spans = [{"name": "learner-0", "kind": "checkpoint", "start": 5.0, "end": 5.2},
             {"name": "learner-0", "kind": "checkpoint", "start": 10.0, "end": 10.4},
             {"name": "learner-0", "kind": "checkpoint_final", "start": 14.0, "end": 19.5},
             {"name": "learner-0", "kind": "train", "start": 1.0, "end": 2.0}]
    out = span_medians(spans)
    assert out["checkpoint"] == {"median": 0.3, "max": 0.4, "count": 2}  # every background stall, first included
    assert out["checkpoint_final"]["median"] == 5.5 and out["checkpoint_final"]["count"] == 1
