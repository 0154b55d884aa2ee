"""Fakes and spawned process bodies for the weight-push tests (imported by the spawned children too)."""

from __future__ import annotations

import time

import numpy as np
import torch

from asyncrl.engine.protocol import GenerationOutput
from asyncrl.records import FinishReason


def tiny_state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    """A small model's state dict in several dtypes (fp32, bf16, fp16, int64 buffer, a scalar)."""
    g = torch.Generator().manual_seed(seed)
    sd = {
        "model.embed_tokens.weight": torch.randn(64, 16, generator=g).to(torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16, generator=g).to(torch.bfloat16),
        "model.layers.0.self_attn.k_proj.weight": torch.randn(16, 16, generator=g).to(torch.bfloat16),
        "model.layers.0.input_layernorm.weight": torch.randn(16, generator=g),
        "model.layers.0.mlp.up_proj.weight": torch.randn(32, 16, generator=g).to(torch.float16),
        "model.layers.0.mlp.down_proj.weight": torch.randn(16, 32, generator=g).to(torch.float16),
        "model.norm.weight": torch.randn(16, generator=g),
        "model.rotary.positions": torch.arange(10, dtype=torch.int64) * (seed + 1),
        "model.scale": torch.tensor(0.5 + seed),
        "lm_head.weight": torch.randn(64, 16, generator=g).to(torch.bfloat16),
    }
    return sd


class FakeEngine:
    """Records what the weight protocol does to an engine (the Engine Protocol's weight half)."""

    def __init__(self, device: str = "cpu", fail_load_at_version: int | None = None, die_at_version: int | None = None,
                 end_s: float = 0.0):
        self.device = device
        self.end_s = end_s  # end_weight_update takes this long (an adapter merge, an FP8 requantization)
        self.die_at_version = die_at_version  # SIGKILL this process when the update to it begins
        self.weights: dict[str, torch.Tensor] = {}
        self.events: list[str] = []
        self._version = 0
        self._pending_version: int | None = None
        self.fail_load_at_version = fail_load_at_version
        self.load_calls = 0

    @property
    def weight_version(self) -> int:
        return self._version

    def pause(self, mode: str) -> list[GenerationOutput]:
        self.events.append(f"pause:{mode}")
        if mode != "abort":
            return []
        z = np.zeros(0, dtype=np.int32)
        return [GenerationOutput(request_id="r0", sample_index=0, token_ids=z, logprobs=z.astype(np.float32),
                                 versions=z, finish_reason=FinishReason.ABORT)]

    def resume(self) -> None:
        self.events.append("resume")

    def begin_weight_update(self) -> None:
        if self.die_at_version is not None and self._version + 1 == self.die_at_version:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGKILL)  # dies with the learner's broadcast of bucket 0 in flight
        self.events.append("begin")

    def load_weights(self, named_tensors) -> None:
        self.load_calls += 1
        if self.fail_load_at_version is not None and self._version + 1 == self.fail_load_at_version:
            self.fail_load_at_version = None
            raise RuntimeError("injected load failure")
        for name, t in named_tensors:
            self.weights[name] = t.to(self.device, copy=True)
        self.events.append("load")

    def end_weight_update(self, version: int) -> None:
        time.sleep(self.end_s)
        self._version = version
        self.events.append(f"end:{version}")

    def receiving_ranks(self) -> int:
        return 1


def run_generator(endpoint: str, name: str, out_q, stop, device: str = "cpu", fail_load_at_version=None,
                  die_at_version=None, end_s: float = 0.0, ipc_staging: bool = False) -> None:
    """A generator loop: poll between (fake) decode steps, report every update result to the test."""
    from asyncrl.weights.receiver import WeightReceiver

    engine = FakeEngine(device, fail_load_at_version, die_at_version, end_s)
    rx = WeightReceiver(endpoint, name, device, engine, timeout_s=10.0, ipc_staging=ipc_staging)
    try:
        while not stop.is_set():
            result = rx.poll(0.01)
            if result is None:
                continue
            weights = {k: fingerprint(v) for k, v in engine.weights.items()}
            out_q.put({"name": name, "ok": result.ok, "version": result.version, "error": result.error,
                       "aborted": len(result.aborted), "timings": result.timings, "events": list(engine.events),
                       "weights": weights, "rejected": rx.rejected.as_dict(), "mid_update": rx.mid_update})
            engine.events.clear()
    finally:
        rx.close()


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-exact equality (NaN-safe), dtype and shape included."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


def fingerprint(t: torch.Tensor) -> tuple[str, list[int], bytes]:
    """dtype, shape and raw bytes: what the spawned generators report (plain data through the queue)."""
    t = t.detach().cpu().contiguous()
    return str(t.dtype), list(t.shape), t.reshape(-1).view(torch.uint8).numpy().tobytes()


def group_member(port: int, group_name: str, backend: str, use_helper: bool, device: str, out_q) -> None:
    """Rank 1 of a two-rank weight group; with use_helper it joins the way SGLang's ranks do
    (rendezvous + PrefixStore + torch's _new_process_group_helper), else with asyncrl's WeightGroup."""
    import datetime

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from asyncrl.weights.group import WeightGroup, connect_store

    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    buf = torch.zeros(1000, dtype=torch.uint8, device=device)
    if use_helper:
        timeout = datetime.timedelta(seconds=10)
        store, _, _ = next(c10d.rendezvous(f"tcp://127.0.0.1:{port}", 1, 2, timeout=timeout))
        pg, _ = c10d._new_process_group_helper(2, 1, [], c10d.Backend(backend), dist.PrefixStore(group_name, store),
                                               group_name=group_name, timeout=timeout)
        c10d._world.pg_group_ranks[pg] = {0: 0, 1: 1}
        dist.broadcast(buf, src=0, group=pg)
        out_q.put((dist.is_initialized(), fingerprint(buf)))
    else:
        group = WeightGroup(connect_store("127.0.0.1", port, 2, 10.0), group_name=group_name, rank=1, world_size=2,
                            backend=backend, timeout_s=10.0)
        group.wait(group.broadcast(buf), 10.0)
        out_q.put((dist.is_initialized(), fingerprint(buf)))
        group.close()


def run_learner(device: str, backend: str, timeout_s: float, out_q, cmd_q) -> None:
    """A learner process with its own default process group (world of one) and a WeightSender: pushes v1,
    v2 (during which the test's generator dies), checks the default group still works, then serves the
    restarted generator's join with a full push of v2 and pushes v3. Reports each step to `out_q`."""
    import socket

    import torch.distributed as dist

    from asyncrl.weights.sender import WeightSender

    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    sds = {v: {k: t.to(device) for k, t in tiny_state_dict(v).items()} for v in (1, 2, 3)}
    sender = WeightSender("tcp://127.0.0.1:0", device=device, bucket_bytes=512, timeout_s=timeout_s)
    try:
        out_q.put(sender.endpoint)
        sender.wait_for_joins(1, 60)
        for v in (1, 2):
            r = sender.push(sds[v].items(), version=v)
            out_q.put(("push", v, r.generators, dict(r.dropped)))
        t = torch.full((4,), 3.0, device=device)
        dist.all_reduce(t)  # the learner's own group, after the weight group was aborted
        out_q.put(("default_group", t.cpu().tolist()))
        cmd_q.get(timeout=60)  # the test restarted the generator
        sender.wait_for_joins(1, 60)
        r = sender.serve_joins(lambda: sds[2].items(), version=2)
        out_q.put(("serve_joins", 2, r.generators if r else None, dict(r.dropped) if r else None))
        r = sender.push(sds[3].items(), version=3)
        out_q.put(("push", 3, r.generators, dict(r.dropped)))
    finally:
        sender.close()
        dist.destroy_process_group()
