"""The journal's writer thread (`Flusher`): the same files as the synchronous journal, tickets that become
durable only after their fsync, replies held until then, and a writer error that reaches the loop."""

from __future__ import annotations

import threading
import time

import pytest
from replay_fakes import arrive, fingerprint, prompt, scripted_run

from asyncrl import records as R
from asyncrl.net.peer import HubPeer
from asyncrl.replay import log as replay_log
from asyncrl.replay.config import HubConfig
from asyncrl.replay.journal import Journal
from asyncrl.replay.journal_format import decode_record, encode_record
from asyncrl.replay.log import iter_records
from asyncrl.replay.segments import REF_SEGMENTS, Segments
from asyncrl.replay.snapshot import PackedGroup, encode_state, pack_image, state_image
from asyncrl.replay.state import HubState
from bench.journal import OFF, accounting, synthetic_run

pytestmark = pytest.mark.timeout(60)


def live_and_resumed(path, background: bool, compact_bytes: int) -> tuple[tuple, tuple, int]:
    j = Journal.open(path, compact_bytes=compact_bytes, background=background)
    synthetic_run(j, 40, prompts_per_step=3, n=2, tokens=8)
    live = (fingerprint(j.state), accounting(j))
    j.close()
    again = Journal.open(path)
    resumed = (fingerprint(again.state), accounting(again))
    again.close()
    return live, resumed, j.snapshots_written


def test_background_journal_resumes_as_the_synchronous_one(tmp_path, monkeypatch):
    sync_live, sync_resumed, _ = live_and_resumed(tmp_path / "sync" / "replay.log", False, OFF)
    assert sync_resumed == sync_live
    live, resumed, _ = live_and_resumed(tmp_path / "fast" / "replay.log", True, 4096)  # rotations skipped
    assert resumed == live and live[1] == sync_live[1]  # while a snapshot is still being written

    sync = Journal.sync

    def settled(j: Journal) -> int:  # a slower run: each snapshot is in place before the next sync
        ticket = sync(j)
        while j.flusher is not None and j.flusher.snapshot_pending:
            time.sleep(0.001)
        return ticket

    monkeypatch.setattr(Journal, "sync", settled)
    live, resumed, snapshots = live_and_resumed(tmp_path / "bg" / "replay.log", True, 4096)
    assert resumed == live and live[1] == sync_live[1]
    files = Segments(tmp_path / "bg" / "replay.log")
    assert snapshots > 2 and len(files.snapshots()) == 2 and len(files.segments()) <= 3 + REF_SEGMENTS  # pruned


def test_snapshot_image_packs_to_the_same_bytes_and_stays_put_while_the_state_moves():
    j = Journal(HubState(), None)
    scripted_run(j)
    image = state_image(j.state, 3)
    before = encode_state(j.state, 3)
    plain = [decode_record(g) if isinstance(g, PackedGroup) else g for g in image["groups"]]
    assert any(isinstance(g, PackedGroup) for g in image["groups"])  # the queued prompts, as submitted
    assert b"".join(pack_image(image)) == encode_record({**image, "groups": plain}) == before
    sub = R.SubmitPrompts(prompts=[prompt("later")])
    j.submit(b"", sub)  # the hub goes on mutating; the image taken earlier does not change
    assert b"".join(pack_image(image)) == before != encode_state(j.state, 3)


class BlockedSync:
    """LogWriter.sync that waits for `release` (a slow disk) once `block` is set."""

    def __init__(self, monkeypatch) -> None:
        self.block, self.release, self.entered = threading.Event(), threading.Event(), threading.Event()
        original = replay_log.LogWriter.sync

        def sync(writer) -> None:
            if self.block.is_set():
                self.entered.set()
                self.release.wait(10)
            original(writer)

        monkeypatch.setattr(replay_log.LogWriter, "sync", sync)


def test_a_ticket_is_durable_only_after_its_fsync(tmp_path, monkeypatch):
    disk = BlockedSync(monkeypatch)
    path = tmp_path / "replay.log"
    j = Journal.open(path, background=True)
    disk.block.set()
    frame, msg = arrive(R.SubmitPrompts(prompts=[prompt("a")]))
    j.submit(frame, msg)
    ticket = j.sync()
    assert disk.entered.wait(5)
    assert j.durable() < ticket  # written maybe, not yet synced: nothing may acknowledge it
    disk.release.set()
    j.wait_durable()
    assert j.durable() >= ticket and len(list(iter_records(path))) == 1
    j.close()


def test_records_nobody_waits_for_are_written_and_fsynced_with_the_next_ones_someone_does(tmp_path, monkeypatch):
    """`sync(durable=False)`: written, no fsync of their own, not durable; the next durable sync, even with
    nothing new to write, fsyncs them too. The fsyncs are counted."""
    fsyncs: list[int] = []
    original = replay_log.LogWriter.sync
    monkeypatch.setattr(replay_log.LogWriter, "sync", lambda w: (fsyncs.append(1), original(w))[1])
    path = tmp_path / "replay.log"
    j = Journal.open(path, background=True)
    frame, msg = arrive(R.SubmitPrompts(prompts=[prompt("a")]))
    j.submit(frame, msg)
    quiet = j.sync(durable=False)
    time.sleep(0.2)  # the writer thread has taken it (into its file buffer)
    assert fsyncs == [] and j.durable() < quiet  # nobody waits for it: not fsynced, not durable
    ticket = j.sync()  # nothing new, but now someone waits: one fsync, for the earlier records
    assert ticket > quiet
    j.wait_durable()
    assert j.durable() >= ticket and len(fsyncs) == 1 and len(list(iter_records(path))) == 1
    assert j.sync() == ticket  # already durable: no job, no fsync
    time.sleep(0.1)
    assert len(fsyncs) == 1
    j.close()


def test_a_writer_error_reaches_the_loop(tmp_path, monkeypatch):
    j = Journal.open(tmp_path / "replay.log", background=True)

    def broken(writer) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(replay_log.LogWriter, "sync", broken)
    frame, msg = arrive(R.SubmitPrompts(prompts=[prompt("a")]))
    j.submit(frame, msg)
    ticket = j.sync()
    j.wait_durable()
    assert j.durable() < ticket
    with pytest.raises(OSError, match="No space"):
        j.sync()
    j.close()  # does not raise again: the hub already failed on the error


def test_the_hub_replies_only_once_the_log_is_synced(tmp_path, monkeypatch, start_hub):
    disk = BlockedSync(monkeypatch)
    h = start_hub(HubConfig(), run_dir=tmp_path)
    got: list[object] = []
    with HubPeer(h.endpoint, "t", timeout_s=20) as peer:
        peer.request(R.Heartbeat(service="test", name="t"))  # connected, nothing logged
        disk.block.set()
        asking = threading.Thread(target=lambda: got.append(peer.request(R.SubmitPrompts(prompts=[prompt("a")]))))
        asking.start()
        assert disk.entered.wait(5)
        time.sleep(0.3)
        assert not got  # the submit is logged, not yet durable: its Ack is held
        disk.release.set()
        asking.join(10)
        assert isinstance(got[0], R.Ack) and got[0].info == {"prompt_ids": ["a"]}


def test_a_lease_is_answered_before_its_grant_is_durable_but_a_peer_s_replies_stay_in_order(tmp_path, monkeypatch,
                                                                                            start_hub):
    """`hub.UNHELD`: with the disk stalled, a lease still comes back (its grant is not yet durable, and nobody
    waits for it: no fsync of its own); a submit's Ack waits for the fsync of its records and the grant's.
    Another peer's lease never waits behind this one's held reply, and a peer's own replies keep the order of
    its requests."""
    disk = BlockedSync(monkeypatch)
    h = start_hub(HubConfig(), run_dir=tmp_path)
    with HubPeer(h.endpoint, "c", timeout_s=20) as client, HubPeer(h.endpoint, "g0", timeout_s=20) as gen:
        client.request(R.SubmitPrompts(prompts=[prompt("a"), prompt("b")]))  # durable: the disk runs
        disk.block.set()
        lease = gen.request(R.LeaseRequest(generator="g0", max_prompts=1, wait_s=0.0))
        assert [p.prompt_id for p in lease.prompts] == ["a"]
        assert not disk.entered.wait(0.3)  # the grant is written, not fsynced on its own
        held: list[object] = []
        asking = threading.Thread(target=lambda: held.append(client.request(R.SubmitPrompts(prompts=[prompt("c")]))))
        asking.start()
        assert disk.entered.wait(5)  # the submit's records, and the grant before them, are being synced
        time.sleep(0.3)
        assert not held  # an Ack of what is not durable yet: held
        assert gen.request(R.LeaseRequest(generator="g0", max_prompts=1, wait_s=0.0)).prompts[0].prompt_id == "b"
        disk.release.set()
        asking.join(10)
        assert held and held[0].info == {"prompt_ids": ["c"]}


def test_a_second_close_leaves_descriptors_opened_since_alone(tmp_path):
    """Closing the background journal twice must not close the wake pipe's numbers again: the process may have
    reused them (another hub's ZeroMQ sockets saw 'Socket operation on non-socket' in the suite)."""
    import os

    j = Journal.open(tmp_path / "run", background=True)
    synthetic_run(j, 2, prompts_per_step=1, n=2, tokens=4)
    fds = (j.flusher.wake_fd, j.flusher._wake_w)
    j.close()
    reused = [os.open(os.devnull, os.O_RDONLY) for _ in range(8)]  # the lowest free numbers: the pipe's among them
    try:
        assert set(fds) <= set(reused)
        j.close()
        for fd in reused:
            os.fstat(fd)  # still open: OSError (EBADF) if the second close took it
    finally:
        for fd in reused:
            os.close(fd)
