"""The hub's log: framing, torn tails at every byte, and restart = same state."""

from __future__ import annotations

import os

from replay_fakes import fingerprint, prompt, scripted_run

from asyncrl import records as R
from asyncrl import wire
from asyncrl.replay.journal import Journal, apply
from asyncrl.replay.journal_format import decode_record
from asyncrl.replay.log import HEADER, LogWriter, iter_records, valid_length
from asyncrl.replay.state import HubState


def boundaries(path) -> list[int]:
    ends, pos = [0], 0
    for payload in iter_records(path):
        pos += HEADER.size + len(payload)
        ends.append(pos)
    return ends


def test_records_round_trip_and_torn_tail_at_every_byte(tmp_path):
    path = tmp_path / "x.log"
    w = LogWriter(path, fsync="always")
    payloads = [os.urandom(n) for n in (0, 1, 7, 300)]
    for p in payloads:
        w.append(p)
    w.close()
    data = path.read_bytes()
    ends = boundaries(path)
    assert list(iter_records(path)) == payloads
    for cut in range(len(data) + 1):
        path.write_bytes(data[:cut])
        complete = max(i for i, e in enumerate(ends) if e <= cut)
        assert list(iter_records(path)) == payloads[:complete], cut
        assert valid_length(path) == ends[complete]


def test_corrupt_byte_in_last_record_is_dropped(tmp_path):
    path = tmp_path / "x.log"
    w = LogWriter(path)
    w.append(b"first")
    w.append(b"second")
    w.close()
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert list(iter_records(path)) == [b"first"]


def test_writer_truncates_torn_tail_before_appending(tmp_path):
    path = tmp_path / "x.log"
    w = LogWriter(path)
    w.append(b"one")
    w.close()
    with open(path, "ab") as f:
        f.write(b"\x10\x00\x00")  # half a header
    w = LogWriter(path, fsync="never")
    w.append(b"two")
    w.close()
    assert list(iter_records(path)) == [b"one", b"two"]


def replayed(records: list[bytes]) -> dict:
    st = HubState()
    for r in records:
        apply(st, decode_record(r))
    return fingerprint(st)


def test_restart_rebuilds_the_same_state(tmp_path):
    path = tmp_path / "replay.log"
    j = Journal.open(path, fsync="batch")
    scripted_run(j)
    live = fingerprint(j.state)
    j.close()
    again = Journal.open(path)
    assert fingerprint(again.state) == live
    assert again.state.book.delivered[2].groups[0].prompt.prompt_id == j.state.book.delivered[2].groups[0].prompt.prompt_id
    again.close()


def test_crash_at_every_boundary_and_inside_the_last_records(tmp_path):
    path = tmp_path / "replay.log"
    j = Journal.open(path)
    scripted_run(j)
    j.close()
    records = list(iter_records(path))
    data = path.read_bytes()
    ends = boundaries(path)
    expected = [replayed(records[:k]) for k in range(len(records) + 1)]
    cuts = set(ends) | set(range(ends[-4], len(data) + 1))  # every boundary + every byte of the last 3 records
    for cut in sorted(cuts):
        path.write_bytes(data[:cut])
        complete = max(i for i, e in enumerate(ends) if e <= cut)
        j = Journal.open(path)
        assert fingerprint(j.state) == expected[complete], f"cut at byte {cut}"
        j.close()
    # after a torn tail the hub keeps logging, and a second restart sees everything
    path.write_bytes(data[: ends[-1] - 3])
    j = Journal.open(path)
    sub = R.SubmitPrompts(prompts=[prompt("late")])
    j.submit(wire.encode(sub), sub)
    live = fingerprint(j.state)
    j.close()
    reopened = Journal.open(path)
    assert fingerprint(reopened.state) == live
    reopened.close()
