"""python -m bench.nccl_diag [--learner-device cuda:0] [--generator-device cuda:1] [--mib 64] [--pushes 3]

Diagnoses the two-process weight push: a learner-side WeightSender in this process and a WeightReceiver
in a spawned child, each printing every phase it reaches (`[learner +12.3s] phase ...`), so a hang shows
which side waits for what. Stages, each bounded:

    1. bare   WeightGroup broadcast between the two processes (the control: no ZeroMQ protocol)
    2. join   the receiver's WeightJoin -> WeightGroupInit -> group Ack
    3. push   `--pushes` full pushes (the first creates the NCCL communicator); the child checks every
              tensor's checksum against the learner's after each update

NCCL_DEBUG=WARN (unless set), NVLink multicast off, and `faulthandler.dump_traceback_later` on both sides:
a side stuck past its deadline prints every thread's stack and exits, so the whole run ends within
`--deadline-s` (default 170 s) even if it hangs. Exit status 0 only when every stage passed on both sides.
On a CPU-only machine, pass `--learner-device cpu --generator-device cpu` (gloo) to check the script itself.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import sys
import time

from asyncrl.net.nccl_env import nccl_env  # torch-free: the settings must precede importing torch

os.environ.setdefault("NCCL_DEBUG", "WARN")
os.environ.update(nccl_env())  # as the launcher gives its GPU children; the spawned side inherits it

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

from bench.weight_sync import SinkEngine  # noqa: E402

T0 = time.monotonic()


def phase(side: str, text: str) -> None:
    print(f"[{side} +{time.monotonic() - T0:6.1f}s] {text}", flush=True)


def make_weights(mib: int, device: str) -> list[tuple[str, torch.Tensor]]:
    """bf16 on GPU (fp32 on CPU) tensors of `mib` MiB in all, a few shapes, deterministic."""
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    g = torch.Generator().manual_seed(0)
    per = (mib << 20) // 8 // dtype.itemsize  # elements per tensor, 8 tensors
    out = [(f"model.layers.{i}.mlp.weight", torch.randn(per, generator=g).to(dtype).to(device)) for i in range(8)]
    out.append(("model.norm.weight", torch.randn(896, generator=g).to(dtype).to(device)))
    return out


def checksums(named) -> dict[str, float]:
    return {n: float(t.float().sum().item()) for n, t in named}


def child(endpoint: str, bare_port: int, device: str, mib: int, pushes: int, deadline_s: float, out) -> None:
    faulthandler.dump_traceback_later(deadline_s - 10, exit=True)
    global T0
    T0 = time.monotonic()
    from asyncrl.weights.group import WeightGroup, connect_store
    from asyncrl.weights.receiver import WeightReceiver

    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    backend = "nccl" if device.startswith("cuda") else "gloo"
    phase("generator", f"bare: connecting ({backend}, {device})")
    group = WeightGroup(connect_store("127.0.0.1", bare_port, 2, 30), group_name="diag-bare", rank=1, world_size=2,
                        backend=backend, timeout_s=30)
    buf = torch.zeros(1 << 20, dtype=torch.uint8, device=device)
    group.wait(group.broadcast(buf), 30)
    phase("generator", f"bare: received, sum={int(buf.sum())}")
    group.close()
    engine = SinkEngine({n: torch.empty_like(t) for n, t in make_weights(mib, device)})
    phase("generator", "join: WeightReceiver sends WeightJoin")
    rx = WeightReceiver(endpoint, "diag-generator", device, engine, timeout_s=40)
    expect = checksums(make_weights(mib, device))
    deadline = time.monotonic() + deadline_s - 20
    ok = True
    while engine.weight_version < pushes and time.monotonic() < deadline:
        was_ready = rx.ready
        result = rx.poll(0.05)
        if rx.ready and not was_ready and result is None:
            phase("generator", "join: in the group (Ack sent)")
        if result is None:
            continue
        got = checksums(engine.params.items())
        match = all(abs(got[n] - expect[n]) <= 1e-3 * max(1.0, abs(expect[n])) for n in expect)
        ok = ok and result.ok and match
        phase("generator", f"push: update ok={result.ok} v{result.version} checksums_match={match} "
                           f"timings={ {k: round(v, 4) for k, v in result.timings.items()} } {result.error}")
    ok = ok and engine.weight_version >= pushes
    phase("generator", f"done: version {engine.weight_version}, ok={ok}")
    rx.close()
    out.put(ok)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.nccl_diag", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--learner-device", default="cuda:0")
    p.add_argument("--generator-device", default="cuda:1")
    p.add_argument("--mib", type=int, default=64)
    p.add_argument("--pushes", type=int, default=3)
    p.add_argument("--deadline-s", type=float, default=170.0)
    args = p.parse_args(argv)
    faulthandler.dump_traceback_later(args.deadline_s, exit=True)
    from asyncrl.weights.group import host_store
    from asyncrl.weights.sender import WeightSender

    dev = args.learner_device
    if dev.startswith("cuda"):
        torch.cuda.set_device(dev)
    backend = "nccl" if dev.startswith("cuda") else "gloo"
    phase("learner", f"start: torch {torch.__version__}, nccl {_nccl_version()}, {dev} -> {args.generator_device}, "
                     f"NCCL_DEBUG={os.environ['NCCL_DEBUG']}")
    store = host_store("127.0.0.1", 2, 30)
    sender = WeightSender("tcp://127.0.0.1:0", device=dev, bucket_bytes=16 << 20, timeout_s=40)
    out = mp.get_context("spawn").Queue()
    proc = mp.get_context("spawn").Process(target=child, daemon=True, args=(
        sender.endpoint, store.port, args.generator_device, args.mib, args.pushes, args.deadline_s, out))
    proc.start()
    ok = False
    try:
        ok = _learner_stages(sender, store, backend, dev, args)
        child_ok = out.get(timeout=30)
        phase("learner", f"generator reported ok={child_ok}")
        ok = ok and child_ok
    except Exception as e:  # a stage failed: say which, then stop the child
        phase("learner", f"FAILED: {type(e).__name__}: {e}")
    finally:
        sender.close()
        proc.join(15)
        if proc.is_alive():
            phase("learner", "generator still alive after 15 s: killing it")
            proc.kill()
    phase("learner", f"RESULT {'PASS' if ok else 'FAIL'} (generator exit code {proc.exitcode})")
    return 0 if ok else 1


def _learner_stages(sender, store, backend: str, dev: str, args) -> bool:
    from asyncrl.weights.group import WeightGroup

    phase("learner", "bare: broadcasting 1 MiB")
    group = WeightGroup(store, group_name="diag-bare", rank=0, world_size=2, backend=backend, timeout_s=30)
    group.wait(group.broadcast(torch.full((1 << 20,), 3, dtype=torch.uint8, device=dev)), 30)
    phase("learner", "bare: done")
    group.close()
    phase("learner", "join: waiting for WeightJoin")
    if sender.wait_for_joins(1, 60) != 1:
        raise TimeoutError("no WeightJoin within 60 s")
    weights = make_weights(args.mib, dev)
    ok = True
    for version in range(1, args.pushes + 1):
        phase("learner", f"push: v{version} begins (first push admits the joiner and creates the communicator)")
        report = sender.push(iter(weights), version)
        phase("learner", f"push: v{version} -> {report.generators} dropped={report.dropped} "
                         f"total={report.total_s:.3f}s transfer={report.transfer_s:.3f}s gbps={report.gbps:.1f}")
        ok = ok and report.generators == ["diag-generator"] and not report.dropped
    return ok


def _nccl_version() -> str:
    try:
        return ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else "-"
    except Exception:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
