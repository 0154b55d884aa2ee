"""bench.replay stays runnable: a tiny run through a real hub process with authenticated peers."""

import json
import subprocess
import sys


def test_replay_bench_small_run():
    out = subprocess.run([sys.executable, "-m", "bench.replay", "--steps", "3", "--prompts-per-step", "4", "--n", "2",
                          "--tokens", "16", "--lease-prompts", "2"], capture_output=True, text=True, timeout=240,
                         check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["bench"] == "replay" and result["samples"] == 3 * 4 * 2 and result["samples_per_s"] > 0


def test_replay_bench_two_shards_two_producers():
    """A hub of two shards, fed by two generator-like peers through ShardedPeer: every sample is trained once."""
    out = subprocess.run([sys.executable, "-m", "bench.replay", "--steps", "3", "--prompts-per-step", "4", "--n", "2",
                          "--tokens", "16", "--lease-prompts", "2", "--shards", "2", "--producers", "2"],
                         capture_output=True, text=True, timeout=240, check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["samples"] == 3 * 4 * 2 and result["context"]["shards"] == 2
    assert set(result["peer_cpu_s"]) == {"producer-0", "producer-1", "scorer", "learner"}


def test_prompt_ids_fill_every_shard_equally_and_quotas_add_up():
    from collections import Counter

    from asyncrl.net.hub_shards import shard_of
    from bench.replay import producer_quota, prompt_ids

    ids = prompt_ids(96, 4)
    assert len(set(ids)) == 96 and Counter(shard_of(p, 4) for p in ids) == {0: 24, 1: 24, 2: 24, 3: 24}
    assert prompt_ids(5, 1) == ["b0", "b1", "b2", "b3", "b4"]
    assert [producer_quota(10, 3, i) for i in range(3)] == [4, 3, 3]


def test_shards_must_divide_the_step():
    out = subprocess.run([sys.executable, "-m", "bench.replay", "--prompts-per-step", "6", "--shards", "4"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "a multiple of --shards" in out.stderr
