"""A generator killed during a push: the learner drops (aborts) that member's group only, its own default
group keeps working, and the restarted generator rejoins with a full push. CPU/gloo here; the same over
NCCL on two GPUs in the gpu-marked test."""

import queue

import pytest
import torch
import torch.multiprocessing as mp
from weights_procs import fingerprint, run_generator, run_learner, tiny_state_dict

CTX = mp.get_context("spawn")


def _next(q, what: str, timeout_s: float = 90.0):
    try:
        return q.get(timeout=timeout_s)
    except queue.Empty:
        pytest.fail(f"no {what} within {timeout_s}s")


def _kill_during_push_then_rejoin(learner_device: str, generator_device: str, backend: str, timeout_s: float) -> None:
    out, cmd, stop = CTX.Queue(), CTX.Queue(), CTX.Event()
    learner = CTX.Process(target=run_learner, args=(learner_device, backend, timeout_s, out, cmd), daemon=True)
    learner.start()
    procs = [learner]
    try:
        endpoint = _next(out, "learner endpoint")
        gq = CTX.Queue()
        doomed = CTX.Process(target=run_generator, args=(endpoint, "g0", gq, stop), daemon=True,
                             kwargs={"device": generator_device, "die_at_version": 2})
        doomed.start()
        procs.append(doomed)
        assert _next(out, "push v1") == ("push", 1, ["g0"], {})  # g0 acked v1 (its own report may die with it)
        kind, version, got, dropped = _next(out, "push v2")
        assert (kind, version, got) == ("push", 2, []) and "g0" in dropped, dropped
        assert _next(out, "default group check") == ("default_group", [3.0] * 4)
        doomed.join(10)
        assert doomed.exitcode == -9  # it really died inside the update

        gq2 = CTX.Queue()
        fresh = CTX.Process(target=run_generator, args=(endpoint, "g0", gq2, stop), daemon=True,
                            kwargs={"device": generator_device})
        fresh.start()
        procs.append(fresh)
        cmd.put("restarted")
        assert _next(out, "serve_joins") == ("serve_joins", 2, ["g0"], {})
        r = _next(gq2, "the rejoined g0's full push")
        assert r["ok"] and r["version"] == 2
        assert r["weights"] == {k: fingerprint(v) for k, v in tiny_state_dict(2).items()}  # full, bit-exact
        assert _next(out, "push v3") == ("push", 3, ["g0"], {})
        assert _next(gq2, "g0's v3")["version"] == 3
    finally:
        stop.set()
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()


def test_generator_killed_during_push_is_dropped_and_rejoins_with_a_full_push():
    _kill_during_push_then_rejoin("cpu", "cpu", "gloo", timeout_s=5.0)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs (NCCL refuses two ranks on one GPU)")
def test_generator_killed_during_nccl_push_on_two_gpus():
    _kill_during_push_then_rejoin("cuda:0", "cuda:1", "nccl", timeout_s=20.0)
