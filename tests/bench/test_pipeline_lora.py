"""bench.pipeline's LoRA options on CPU: an adapter-pushing run stopped early, and the GPU memory probe."""

import json
import os
import subprocess
import sys

import bench.pipeline as bp


def test_lora_run_async_only_stops_early_and_reports_pushes_and_the_checkpoint(tmp_path, capsys):
    bp.main(["--lora-rank", "4", "--modes", "async", "--repeats", "1", "--stop-after", "2",
             "--set", "learner.steps=40", "--set", "learner.checkpoint_every=2", "--keep", str(tmp_path / "kept")])
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["modes"] == ["async"] and line["sync_steps_per_s"] is None and line["steady_step_s"]["sync"] is None
    assert line["lora"]["rank"] == 4 and line["stop_after"] == 2
    push = line["push"]["async"]
    assert push["kind"] == ["adapter"] and 0 < push["bytes"] < 1_000_000  # the embedded model's merged fp32: 1.6 MB
    files = line["checkpoint_files"]["async"]
    assert 0 < files["model.pt"] < 1_000_000
    run = tmp_path / "kept" / "async-0"
    steps = len((run / "metrics.jsonl").read_text().splitlines())
    assert 2 <= steps < 40 and not (run / "export").exists()  # stopped: no export
    assert [p.name for p in (tmp_path / "kept").iterdir()] == ["async-0"]


def test_the_memory_probe_writes_a_processes_peaks_and_its_lowest_free_memory(tmp_path):
    """The probe in a child process, against a stand-in `torch` whose CUDA reports fixed numbers: 10 GiB free at
    the first sample, 8 after; device 1 holds nothing of this process."""
    site, out = tmp_path / "site", tmp_path / "gpu_memory"
    child = (
        "import json, sys, time, types\n"
        "stats = {'allocated_bytes.all.peak': 3 * 2**30, 'reserved_bytes.all.peak': 4 * 2**30}\n"
        "frees = iter([10 * 2**30] + [8 * 2**30] * 100000)\n"
        "cuda = types.SimpleNamespace(is_initialized=lambda: True, device_count=lambda: 2,\n"
        "    memory_stats=lambda i: stats if i == 0 else {}, mem_get_info=lambda i: (next(frees), 80 * 2**30))\n"
        "sys.modules['torch'] = types.SimpleNamespace(cuda=cuda)\n"
        f"path, deadline = {str(out / 'learner-0.json')!r}, time.monotonic() + 60\n"
        "while time.monotonic() < deadline:\n"
        "    try:\n"
        "        if json.load(open(path))['0']['min_free_gib'] == 8: break\n"
        "    except (OSError, ValueError, KeyError): pass\n"
        "    time.sleep(0.1)\n")
    before = os.environ.get("PYTHONPATH")
    with bp.memory_probe(site, out):
        subprocess.run([sys.executable, "-c", child, "--name", "learner-0"], check=True, timeout=120)
    assert os.environ.get("PYTHONPATH") == before and bp.MEMORY_ENV not in os.environ  # put back
    assert bp.gpu_memory(tmp_path) == {"learner-0": {"0": {"peak_allocated_gib": 3.0, "peak_reserved_gib": 4.0,
                                                          "total_gib": 80.0, "min_free_gib": 8.0}}}
