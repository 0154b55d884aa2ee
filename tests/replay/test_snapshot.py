"""Journal compaction: snapshots + segments resume to exactly the state a full replay gives; a bad or
missing snapshot falls back to the previous one; history no valid snapshot covers is never deleted."""

from __future__ import annotations

import pytest
from replay_fakes import fingerprint, scripted_run

from bench.journal import OFF, accounting, synthetic_run
from asyncrl.replay.journal import Journal
from asyncrl.replay.log import LogCorrupt
from asyncrl.replay.segments import Segments
from asyncrl.replay.snapshot import decode_state, encode_state
from asyncrl.replay.state import HubState


def run(path, compact_bytes: int, steps: int = 40) -> tuple[dict, dict]:
    j = Journal.open(path, compact_bytes=compact_bytes)
    synthetic_run(j, steps, prompts_per_step=3, n=2, tokens=8)
    live = (fingerprint(j.state), accounting(j))
    j.close()
    return live


def reopened(path) -> tuple[dict, dict]:
    j = Journal.open(path)
    out = (fingerprint(j.state), accounting(j))
    j.close()
    return out


def flip(path, at: int = -1) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_snapshot_round_trip_is_the_same_state():
    j = Journal(HubState(), None)
    scripted_run(j)  # every mutation kind; holds Sample records, leases, ready and delivered batches
    state, segment = decode_state(encode_state(j.state, 5))
    assert segment == 5 and fingerprint(state) == fingerprint(j.state)
    assert state.book.delivered[2].groups[0].samples[0].sample.unpack().prompt_id == \
        j.state.book.delivered[2].groups[0].samples[0].sample.prompt_id


def test_a_snapshot_written_before_a_sample_state_existed_still_loads():
    from asyncrl.replay.journal_format import decode_record, encode_record

    j = Journal(HubState(), None)
    scripted_run(j)
    d = decode_record(encode_state(j.state, 5))
    del d["counts"][1]["filtered"]  # snapshots older than refill have no "filtered" count
    state, _ = decode_state(encode_record(d))
    assert fingerprint(state) == fingerprint(j.state)


def test_compacted_resume_equals_full_replay_and_disk_stays_bounded(tmp_path):
    full, compacted = tmp_path / "full" / "replay.log", tmp_path / "compact" / "replay.log"
    live_full = run(full, OFF)
    live = run(compacted, compact_bytes=4096)
    files = Segments(compacted)
    assert len(files.snapshots()) == 2 and len(files.segments()) <= 2 and 0 not in files.segments()
    assert files.bytes_on_disk() < Segments(full).bytes_on_disk() / 3
    resumed = reopened(compacted)
    assert resumed == live  # same lease ids, queue, groups, batches, counters
    acc, acc_full = resumed[1], reopened(full)[1]
    assert acc == acc_full == live_full[1]  # lost, per-state counts, transitions, events
    assert acc["lost"] == 0 and acc["states"]["trained"] == acc["transitions"]["delivered->trained"] > 0
    assert acc["events"]["batches_committed"] == acc["committed"]  # every step trained once


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_bad_or_missing_newest_snapshot_falls_back_to_the_previous(tmp_path, damage):
    path = tmp_path / "replay.log"
    live = run(path, compact_bytes=4096)
    files = Segments(path)
    newest = files.snapshot(files.snapshots()[-1])
    if damage == "corrupt":
        flip(newest, len(newest.read_bytes()) // 2)
    else:  # a crash after the segment rotated, before its snapshot was renamed into place
        newest.unlink()
    assert reopened(path) == live
    assert newest.with_name(newest.name + ".bad").exists() == (damage == "corrupt")


def test_prune_needs_two_valid_snapshots(tmp_path):
    path = tmp_path / "replay.log"
    run(path, compact_bytes=4096)
    files = Segments(path)
    before = sorted(p.name for p in tmp_path.iterdir())
    flip(files.snapshot(files.snapshots()[0]))
    assert files.prune() == [] and sorted(p.name for p in tmp_path.iterdir()) == before


def test_damaged_history_refuses_resume_and_deletes_nothing(tmp_path):
    path = tmp_path / "replay.log"
    run(path, compact_bytes=4096)
    files = Segments(path)
    older, newest = files.snapshots()
    flip(files.snapshot(newest), 20)  # resume falls back to `older`, then must read segment `older` whole
    flip(files.segment(older))  # a sealed (not the last) segment: damage, not a torn tail
    sizes = sorted(p.stat().st_size for p in tmp_path.iterdir())
    with pytest.raises(LogCorrupt, match="closed cleanly"):
        Journal.open(path)
    flip(files.segment(older))
    flip(files.snapshot(older), 20)  # now no snapshot covers the compacted-away history
    with pytest.raises(LogCorrupt, match="no snapshot covers") as err:
        Journal.open(path)
    assert "\n" not in str(err.value)
    assert sorted(p.stat().st_size for p in tmp_path.iterdir()) == sizes  # bad snapshots only set aside
    assert len(list(tmp_path.glob("*.snap.bad"))) == 2
