"""Adapter-only pushes over gloo (learner.lora_push = "adapter"): the bytes on the wire are the adapters'
(the sender's report), spawned torch engines end every version bitwise at a fresh W0 + scale * B @ A, and a
generator that joins or restarts mid-run gets the base and the adapters from serve_joins. The learner-side
half (a trained Trainer's adapters, logprobs equal to a merged push) is tests/learner/test_lora_push.py."""

import contextlib
import time

import torch
import torch.multiprocessing as mp
from lora_procs import make_tiny_model, run_lora_generator
from safetensors.torch import load_file
from weights_procs import fingerprint

from asyncrl.engine.torch.adapter_merge import merge
from asyncrl.weights.sender import WeightSender

CTX = mp.get_context("spawn")
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
RANK, SCALE = 4, 2.0


@contextlib.contextmanager
def generators(sender: WeightSender, model_path: str):
    stop = CTX.Event()
    procs, out = {}, {}

    def start(name: str):
        out[name] = CTX.Queue()
        procs[name] = CTX.Process(target=run_lora_generator, daemon=True,
                                  args=(sender.endpoint, name, out[name], stop, model_path, TARGETS, SCALE))
        procs[name].start()

    try:
        yield procs, out, start
    finally:
        stop.set()
        for p in procs.values():
            p.join(5)
            if p.is_alive():
                p.kill()
        sender.close()


def adapters(base: dict[str, torch.Tensor], version: int) -> dict[str, torch.Tensor]:
    """Random fp32 A [r, in], B [out, r] of every target for one version (B nonzero: the weights move)."""
    g = torch.Generator().manual_seed(version)
    out = {}
    for name, w in base.items():
        path, _, leaf = name.rpartition(".")
        if leaf == "weight" and path.rsplit(".", 1)[-1] in TARGETS:
            out[f"{path}.lora_A"] = torch.randn(RANK, w.shape[1], generator=g) * 0.1
            out[f"{path}.lora_B"] = torch.randn(w.shape[0], RANK, generator=g) * 0.1
    return out


def expected(base: dict[str, torch.Tensor], ads: dict[str, torch.Tensor]) -> dict[str, tuple]:
    """What the engine must hold: a fresh merge from the base for every target, the base elsewhere."""
    want = {}
    for name, w in base.items():
        path = name.rpartition(".")[0]
        merged = f"{path}.lora_A" in ads and name.endswith(".weight")
        want[name] = fingerprint(merge(w, ads[f"{path}.lora_A"], ads[f"{path}.lora_B"], SCALE) if merged else w)
    return want


def nbytes(named: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in named.values())


def next_results(out: dict, names: list[str], timeout_s: float = 60.0) -> dict[str, dict]:
    deadline = time.monotonic() + timeout_s
    return {n: out[n].get(timeout=max(0.1, deadline - time.monotonic())) for n in names}


def assert_at(result: dict, version: int, want: dict[str, tuple]) -> None:
    assert result["ok"] and result["version"] == version, result["error"]
    got = result["weights"]
    wrong = [k for k in want if got.get(k) != want[k]]
    assert not wrong, f"v{version}: {wrong}"  # bitwise; lm_head is tied to embed_tokens, so it is in there too


def test_adapter_pushes_over_gloo_carry_adapter_bytes_and_joiners_get_the_base(tmp_path):
    model_path = str(make_tiny_model(tmp_path / "tiny"))
    base = load_file(f"{model_path}/model.safetensors")  # fp32: the learner's frozen base on CPU
    sender = WeightSender("tcp://127.0.0.1:0", bucket_bytes=16 << 10, timeout_s=10.0)  # dtype None: as held
    with generators(sender, model_path) as (procs, out, start):
        start("g0")
        assert sender.wait_for_joins(1, 60) == 1
        joined = sender.serve_joins(lambda: iter(base.items()), version=0)  # g0 is at v0 already: nothing sent
        assert joined is not None and joined.generators == ["g0"] and joined.bytes == 0
        members = ["g0"]
        for version in range(1, 6):
            ads = adapters(base, version)
            if version == 3:
                start("g1")  # a generator joining mid-run
                assert sender.wait_for_joins(2, 60) == 2
            if version == 4:
                procs["g0"].kill()  # a member restarting mid-run: its new process rejoins at v0
                procs["g0"].join()
                start("g0")
                deadline = time.monotonic() + 60
                while not sender.has_joins() and time.monotonic() < deadline:  # its join replaces the dead member
                    time.sleep(0.05)
                assert sender.members == ["g1"]
                members = ["g1"]
            report = sender.push(ads.items(), version, admit=False, gather_first=version % 2 == 0)  # both ways
            assert report.generators == members and report.dropped == {}, report  # joiners wait for serve_joins
            # the adapters only: per layer r x (in + out) fp32 over q 64+64, k 64+32, v 64+32, o 64+64,
            # gate 64+128, up 64+128, down 128+64; two layers
            assert report.bytes == nbytes(ads) == 2 * RANK * 1024 * 4
            for name, r in next_results(out, members).items():
                assert_at(r, version, expected(base, ads))
            full = sender.serve_joins(lambda ads=ads: iter([*base.items(), *ads.items()]), version)
            if version in (3, 4):  # the joiner got the base and the adapters of this version
                joiner = "g1" if version == 3 else "g0"
                assert full is not None and full.generators == [joiner] and full.bytes == nbytes(base) + nbytes(ads)
                assert_at(next_results(out, [joiner])[joiner], version, expected(base, ads))
                members = sorted({*members, joiner})
            else:
                assert full is None
        assert members == ["g0", "g1"]


def test_gather_first_packs_the_whole_push_before_the_generators_pause(monkeypatch):
    """push(gather_first=True) consumes the stream into buckets before the step that sends WeightBegin (the
    generators pause there), so their pause does not include the learner's gather; without it, lazily."""
    sender = WeightSender("tcp://127.0.0.1:0", bucket_bytes=1024, timeout_s=1.0)
    pulled: list[int] = []

    def stream():
        for i in range(6):
            pulled.append(i)
            yield f"t{i}", torch.full((128,), float(i))  # 512 bytes: two tensors a bucket

    seen = {}

    def push_to(members, named, version, report, gathered=None):
        seen.update(pulled=list(pulled), gathered=gathered, rest=list(named))
        return report

    monkeypatch.setattr(sender, "_push_to", push_to)
    sender.roster.members = {b"g": None}  # one member: what the push is for (never reached: _push_to is the fake)
    try:
        sender.push(stream(), 1, admit=False, gather_first=True)
        assert seen["pulled"] == list(range(6)) and seen["rest"] == []
        assert [layout.names for _, layout in seen["gathered"]] == [["t0", "t1"], ["t2", "t3"], ["t4", "t5"]]
        pulled.clear()
        sender.push(stream(), 2, admit=False)
        assert seen["pulled"] == [] and seen["gathered"] is None  # lazily, inside _push_to
    finally:
        sender.roster.members = {}
        sender.close()
