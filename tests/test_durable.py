"""durable.PacedFile: a large write reaches the disk in paced chunks (fdatasync every pace_bytes), its bytes
intact, and torch.save / torch.load round-trip through it."""

import os

import torch

from asyncrl.durable import PacedFile


def test_syncs_every_chunk_and_fsyncs_at_close(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(os, "fdatasync", lambda fd: calls.append("data"))
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("full"))
    path = tmp_path / "f.bin"
    with PacedFile(path, pace_bytes=100) as f:
        for i in range(10):
            f.write(bytes([i]) * 45)  # 450 bytes: a sync once 100 or more are unsynced (after 135, 270, 405)
        assert f.tell() == 450
    assert calls == ["data"] * 3 + ["full"]
    assert path.read_bytes() == b"".join(bytes([i]) * 45 for i in range(10))


def test_torch_save_round_trips(tmp_path):
    state = {"w": torch.randn(300, 70), "step": 3, "nested": [torch.arange(5)]}
    path = tmp_path / "ckpt.pt"
    with PacedFile(path, pace_bytes=4096) as f:
        torch.save(state, f)
    back = torch.load(path, weights_only=True)
    assert back["step"] == 3 and torch.equal(back["w"], state["w"]) and torch.equal(back["nested"][0], state["nested"][0])
