"""Journal integrity: a bad record in the middle is refused with one line, never cut away; only a torn
last record is dropped, and its bytes are kept aside."""

from __future__ import annotations

import pytest
from replay_fakes import prompt

from asyncrl import records as R
from asyncrl import wire
from asyncrl.replay.journal import Journal
from asyncrl.replay.log import HEADER, LogCorrupt


def write_log(path, prompts: int = 20) -> None:
    j = Journal.open(path)
    for i in range(prompts):
        msg = R.SubmitPrompts(prompts=[prompt(f"q{i}", 2)])
        j.submit(wire.encode(msg), msg)
    entry, _ = j.grant("g", 2, now=0.0, ttl_s=60.0)
    j.fail_prompts(entry.lease_id, ["q0"])
    j.close()


def test_a_flipped_byte_mid_journal_refuses_resume_and_keeps_every_byte(tmp_path):
    path = tmp_path / "replay.log"
    write_log(path)
    data = bytearray(path.read_bytes())
    mid = len(data) // 2
    data[mid] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(LogCorrupt) as err:
        Journal.open(path)
    line = str(err.value)
    assert "\n" not in line and str(path) in line and "checksum" in line and "move it aside" in line
    assert int(line.split("record at byte ")[1].split()[0]) <= mid
    assert path.read_bytes() == bytes(data)  # nothing truncated


def test_only_a_torn_last_record_is_dropped_and_kept_aside(tmp_path):
    path = tmp_path / "replay.log"
    write_log(path)
    whole = path.read_bytes()
    j = Journal.open(path)
    before = (dict(j.state.events), j.state.counts.snapshot())
    assert j.state.events["prompts_failed"] == 1  # the "fail" record replays
    j.close()
    torn = HEADER.pack(100, 0) + b"x" * 40  # a crash in the middle of the last append
    path.write_bytes(whole + torn)
    j = Journal.open(path)
    assert (dict(j.state.events), j.state.counts.snapshot()) == before
    j.close()
    assert path.read_bytes() == whole
    assert (tmp_path / f"replay.log.torn-{len(whole)}").read_bytes() == torn
    bad_crc_last = bytearray(whole)
    bad_crc_last[-1] ^= 0xFF  # last record's checksum fails, nothing after it: a torn tail
    path.write_bytes(bytes(bad_crc_last))
    Journal.open(path).close()
    assert len(path.read_bytes()) < len(whole)
