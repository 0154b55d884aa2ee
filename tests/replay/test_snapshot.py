"""Journal compaction: snapshots + segments resume to exactly the state a full replay gives; a bad or
missing snapshot falls back to the previous one; history no valid snapshot covers is never deleted."""

from __future__ import annotations

import time

import pytest
from replay_fakes import arrive, fingerprint, ok, prompt, sample, scripted_run

from bench.journal import OFF, accounting, synthetic_run
from asyncrl import records as R
from asyncrl.replay.journal import Journal
from asyncrl.replay.log import LogCorrupt
from asyncrl.replay.segments import REF_SEGMENTS, Segments
from asyncrl.replay.journal_format import decode_record, encode_record
from asyncrl.replay.log import iter_sealed
from asyncrl.replay.snapshot import PackedGroup, SnapshotInvalid, decode_state, encode_state, read_snapshot, state_image
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
    assert len(files.snapshots()) == 2 and len(files.segments()) <= 2 + REF_SEGMENTS and 0 not in files.segments()
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


def long_lived(path, background: bool = False, rounds: int = 6) -> Journal:
    """Groups that stay live while the journal rotates under them: each round leases prompts, logs their
    samples, scores half of the earlier ones and rotates (compact_bytes=1): the live samples were logged
    in the segments just before each snapshot, or in older ones."""
    j = Journal.open(path, compact_bytes=1, background=background)
    for r in range(rounds):
        msg = R.SubmitPrompts(prompts=[prompt(f"r{r}-{i}", n=2) for i in range(3)])
        j.submit(*arrive(msg))
        lease, ps = j.grant("g", 3, now=100.0 + r, ttl_s=1e6)
        j.add_samples(*arrive(R.SampleBatch(lease_id=lease.lease_id,
                                            samples=[sample(p.prompt_id, i, tokens=64) for p in ps for i in range(2)])))
        j.score([ok(f"r{r - 1}-0", 0)] if r else [])
        _settled_sync(j)
    return j


def _settled_sync(j: Journal) -> None:
    j.sync()
    j.wait_durable()
    while j.flusher is not None and j.flusher.snapshot_pending:  # one snapshot at a time, each in place
        time.sleep(0.001)


def sample_entries(path) -> list:
    d = decode_record(next(iter_sealed(path)))
    return [s[0] for g in d["groups"] for s in g[6] if s is not None]


@pytest.mark.parametrize("background", [False, True])
def test_a_snapshot_names_recent_samples_where_they_were_logged_and_resume_reads_them(tmp_path, background):
    path = tmp_path / "replay.log"
    j = long_lived(path, background)
    live = fingerprint(j.state)
    j.close()
    files = Segments(path)
    newest = files.snapshots()[-1]
    entries = sample_entries(files.snapshot(newest))
    refs = [e for e in entries if type(e) is list]
    assert refs and all(newest - REF_SEGMENTS <= e[0] < newest for e in refs)  # recent ones: by reference
    assert any(type(e) is bytes for e in entries)  # older ones: copied
    assert min(files.segments()) >= min(files.snapshots()) - REF_SEGMENTS  # pruned, refs kept
    reopened = Journal.open(path)
    assert fingerprint(reopened.state) == live
    # a resumed hub knows where its samples lie, whether read through a snapshot or replayed from a segment:
    for r in range(6, 9):  # logged in the last segment (no rotation: the default compact_bytes)
        msg = R.SubmitPrompts(prompts=[prompt(f"r{r}-{i}", n=2) for i in range(3)])
        reopened.submit(*arrive(msg))
        lease, ps = reopened.grant("g", 3, now=100.0 + r, ttl_s=1e6)
        reopened.add_samples(*arrive(R.SampleBatch(lease_id=lease.lease_id, samples=[
            sample(p.prompt_id, i, tokens=64) for p in ps for i in range(2)])))
        reopened.sync()
    reopened.close()
    third = Journal.open(path)  # replays rounds 6-8
    third.compact()  # its snapshot names those samples (and the ones it read) where they lie
    live = fingerprint(third.state)
    third.close()
    refs = [e for e in sample_entries(files.snapshot(files.snapshots()[-1])) if type(e) is list]
    assert len(refs) >= 18
    again = Journal.open(path)
    assert fingerprint(again.state) == live
    again.close()
    assert not list(tmp_path.glob("*.bad"))  # each resume loaded the newest snapshot, not a fallback


def test_a_snapshot_is_far_smaller_than_the_samples_it_names(tmp_path):
    path = tmp_path / "replay.log"
    long_lived(path, rounds=REF_SEGMENTS).close()  # every live sample was logged in the last two segments
    files = Segments(path)
    snap = files.snapshot(files.snapshots()[-1])
    entries = sample_entries(snap)
    assert entries and all(type(e) is list for e in entries)
    assert sum(e[3] for e in entries) > 4 * snap.stat().st_size


@pytest.mark.parametrize("damage", ["flip", "truncate", "moved"])
def test_a_named_record_that_is_damaged_or_elsewhere_makes_the_snapshot_unusable(tmp_path, damage):
    path = tmp_path / "replay.log"
    long_lived(path).close()
    files = Segments(path)
    newest = files.snapshots()[-1]
    seg, at, offset, length = next(e for e in sample_entries(files.snapshot(newest)) if type(e) is list)
    target = files.segment(seg)
    data = bytearray(target.read_bytes())
    if damage == "flip":
        data[at + 8 + offset + length // 2] ^= 0xFF
    elif damage == "truncate":
        data = data[:at + 8 + offset]
    else:  # the record is not where the snapshot says: a different file of the same name
        data = bytes(8) + data
    target.write_bytes(bytes(data))
    with pytest.raises(SnapshotInvalid, match=str(target.name)):
        read_snapshot(files.snapshot(newest), files)
    with pytest.raises(SnapshotInvalid, match="segments"):
        read_snapshot(files.snapshot(newest))  # no segments to read them from


def test_a_format_1_snapshot_with_every_sample_copied_still_loads():
    j = Journal(HubState(), None)
    scripted_run(j)
    d = decode_record(encode_state(j.state, 5))
    d["format"] = 1
    state, _ = decode_state(encode_record(d))
    assert fingerprint(state) == fingerprint(j.state)
    d["format"] = 3
    with pytest.raises(SnapshotInvalid, match="newer asyncrl"):
        decode_state(encode_record(d))


def test_a_group_as_submitted_is_packed_once_and_a_touched_one_each_time():
    j = Journal(HubState(), None)
    j.submit(*arrive(R.SubmitPrompts(prompts=[prompt(f"q{i}", n=2) for i in range(3)])))
    image = state_image(j.state, 1)
    packed = [g for g in image["groups"] if isinstance(g, PackedGroup)]
    assert len(packed) == 3 and state_image(j.state, 2)["groups"][0] is packed[0]  # the same bytes, not re-packed
    lease, ps = j.grant("g", 1, now=1.0, ttl_s=60.0)
    leased = [g for g in state_image(j.state, 3)["groups"] if not isinstance(g, PackedGroup)]
    assert len(leased) == 1 and leased[0][2] == lease.lease_id
    j.return_prompts(lease.lease_id, [ps[0].prompt_id])  # as submitted again: its packed entry is right again
    assert all(isinstance(g, PackedGroup) for g in state_image(j.state, 4)["groups"])
    lease, ps = j.grant("g", 1, now=2.0, ttl_s=60.0)
    j.add_samples(*arrive(R.SampleBatch(lease_id=lease.lease_id, samples=[sample(ps[0].prompt_id, 0)])))
    state, _ = decode_state(encode_state(j.state, 5))
    assert fingerprint(state) == fingerprint(j.state)
    assert sum(isinstance(g, PackedGroup) for g in state_image(j.state, 6)["groups"]) == 2
