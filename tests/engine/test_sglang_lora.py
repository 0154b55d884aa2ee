"""Adapter-only LoRA pushes into SGLang (learner.lora_push = "adapter"): the learner's WeightSender broadcasts A/B
to SGLangEngine (over gloo, through WeightReceiver), which loads each version into the double's LoRA serving by a
PEFT folder and /load_lora_adapter, switches new /generate calls to it and unloads the old one once unused. The
double applies the adapter (its logits depend on the adapter's tensors), so the logprobs say which version
generated. Also: the double's LoRA rules, the errors, and how learner.lora_push "auto" resolves."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from asyncrl.config.run import RunConfig
from asyncrl.engine.protocol import GenerationRequest
from asyncrl.engine.sglang.client import SGLangHTTP
from asyncrl.engine.sglang.config import SGLangConfig
from asyncrl.engine.sglang.engine import SGLangEngine
from asyncrl.engine.torch.adapter_merge import LoraSpec
from asyncrl.generator.config import GeneratorConfig
from asyncrl.learner.config import LearnerConfig
from asyncrl.models.peft_adapter import peft_state_dict
from asyncrl.weights.transport import join_as_receiver
from asyncrl.records import SamplingParams
from asyncrl.weights.receiver import WeightReceiver
from asyncrl.weights.sender import WeightSender
from tests.doubles.sglang_double import SGLangDouble
from tests.doubles.sglang_double_lora import lora_key
from tests.doubles.sglang_testing import collect, wait_until

pytestmark = pytest.mark.timeout(60)

TARGETS = ("q_proj", "v_proj")
RANK, ALPHA = 4, 8.0
PROMPT = [3, 1, 4, 1, 5]
MODULES = [f"model.layers.{i}.self_attn.{t}" for i in range(2) for t in TARGETS]


def adapters(seed: int, rank: int = RANK) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    out = {}
    for m in MODULES:
        out[f"{m}.lora_A"] = torch.randn(rank, 16, generator=g)
        out[f"{m}.lora_B"] = torch.randn(16, rank, generator=g)
    return out


def served_key(tensors: dict[str, torch.Tensor]) -> str:
    """The fake model's version key while these adapters are applied over the base label "default"."""
    return f"default+lora:{lora_key(peft_state_dict(tensors), ALPHA / RANK)}"


def request(rid: str, **sampling) -> GenerationRequest:
    return GenerationRequest(request_id=rid, prompt_token_ids=np.asarray(PROMPT, np.int32),
                             sampling=SamplingParams(**sampling))  # fmt: skip


def assert_generated_by(double: SGLangDouble, out, key: str) -> None:
    for i, (tok, lp) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
        expected = double.model.logprobs(key, PROMPT, i, 1.0)[int(tok)]
        assert abs(float(lp) - expected) < 1e-5, (i, key)


class Rig:
    """A learner's WeightSender and a generator's WeightReceiver + SGLangEngine (adapter mode), on the double."""

    def __init__(self, double: SGLangDouble, lora_dir: Path) -> None:
        self.engine = SGLangEngine(SGLangConfig(base_url=double.url, request_timeout_s=10.0, lora_dir=str(lora_dir)),
                                   lora=LoraSpec(TARGETS, ALPHA / RANK), adapter_channel=join_as_receiver)  # fmt: skip
        self.sender = WeightSender("tcp://127.0.0.1:0", bucket_bytes=4096, timeout_s=20.0)
        self.receiver = WeightReceiver(self.sender.endpoint, "generator-0", "cpu", self.engine, timeout_s=20.0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        assert self.sender.wait_for_joins(1, 20) == 1

    def _serve(self) -> None:
        while not self._stop.is_set():
            self.receiver.poll(0.01)

    def push(self, tensors: dict[str, torch.Tensor], version: int) -> dict:
        report = self.sender.push(iter(tensors.items()), version).as_dict()
        assert report["generators"] == ["generator-0"] and not report["dropped"], report
        return report

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.receiver.close()
        self.sender.close()
        self.engine.close()


@pytest.fixture
def double():
    with SGLangDouble(enable_lora=True, max_lora_rank=8, lora_target_modules=("qkv_proj",), load_format="auto",
                      token_delay_s=0.001) as d:
        yield d


def test_adapter_pushes_switch_the_generating_version_and_retire_the_old(double, tmp_path):
    rig = Rig(double, tmp_path)
    try:
        assert rig.engine.receiving_ranks() == 1  # this process receives the adapters, not the server's ranks
        rig.engine.add(request("base", max_new_tokens=6))
        (out,) = collect(rig.engine)
        assert_generated_by(double, out, "default")  # no adapter yet: the base is version 0
        assert (out.versions == 0).all()

        folders = []
        for version in (1, 2, 3):
            tensors = adapters(seed=version)
            rig.push(tensors, version)
            assert rig.engine.weight_version == version
            (name,) = double.loras  # only the current version stays loaded
            assert name.endswith(f"-v{version}")
            folders.append(Path(double.loras[name].path))
            rig.engine.add(request(f"v{version}", max_new_tokens=6))
            (out,) = collect(rig.engine)
            assert_generated_by(double, out, served_key(tensors))
            assert (out.versions == version).all()
        assert [n.rsplit("-", 1)[1] for n in double.unloaded] == ["v1", "v2"]
        assert [f.exists() for f in folders] == [False, False, True]
        assert not double.paused  # adapter pushes never pause the server
        assert not any(p == "/pause_generation" for p, _ in double.calls)
        bodies = [b for p, b in double.calls if p == "/generate"]
        assert "lora_path" not in bodies[0] and bodies[-1]["lora_path"] == rig.engine._lora.active_name
    finally:
        rig.close()
    assert not double.loras and not folders[-1].exists()  # close unloads and deletes what it loaded


def test_a_request_keeps_its_adapter_and_the_old_one_is_unloaded_when_it_finishes(double, tmp_path):
    rig = Rig(double, tmp_path)
    try:
        first = adapters(seed=1)
        rig.push(first, 1)
        (old,) = double.loras
        rig.engine.add(request("long", max_new_tokens=120, ignore_eos=True))
        wait_until(lambda: double.tokens_generated >= 10, what="the long request to run")
        rig.push(adapters(seed=2), 2)  # continue mode: the long request stays in the server, on v1's adapter
        assert old in double.loras and not double.unloaded  # still in use: not unloaded yet
        (out,) = collect(rig.engine, timeout_s=20)
        assert_generated_by(double, out, served_key(first))
        assert (out.versions == 1).all()
        wait_until(lambda: double.unloaded == [old], what="v1's adapter to be unloaded")
        assert not Path(tmp_path / old).exists()
    finally:
        rig.close()


def test_the_double_enforces_the_lora_rules(double, tmp_path):
    http = SGLangHTTP(double.url)

    def post(path: str, body: dict) -> tuple[int, dict]:
        resp = http.request("POST", path, body, timeout_s=10)
        return resp.status, resp.json()

    rig = Rig(double, tmp_path)
    try:
        rig.push(adapters(seed=1), 1)
        (name,) = double.loras
        status, body = post("/load_lora_adapter", {"lora_name": name, "lora_path": double.loras[name].path})
        assert status == 400 and "already loaded" in body["error_message"]
        status, body = post("/generate", {"input_ids": PROMPT, "lora_path": "nope"})
        assert status == 400 and "not loaded: nope" in body["error"]["message"]
        status, body = post("/unload_lora_adapter", {"lora_name": "nope"})
        assert status == 400 and "does not exist" in body["error_message"]
        status, body = post("/unload_lora_adapter", {"lora_name": name})
        assert status == 200 and not double.loras
        status, body = post("/generate", {"input_ids": PROMPT, "lora_path": name})  # unloaded: refused
        assert status == 400
    finally:
        rig.close()
    with SGLangDouble() as off:
        resp = SGLangHTTP(off.url).request("POST", "/load_lora_adapter", {"lora_name": "a", "lora_path": "/x"},
                                           timeout_s=10)  # fmt: skip
        assert resp.status == 400 and "--enable-lora" in resp.json()["error_message"]


def test_errors_name_the_key_and_the_server_flag(double, tmp_path):
    def resolve(url: str, **learner) -> str:
        cfg = RunConfig(learner=LearnerConfig(lora_rank=RANK, lora_targets=list(TARGETS), lora_trainable=[])
                        if not learner else LearnerConfig(**{"lora_trainable": [], **learner}),
                        generator=GeneratorConfig(engine="sglang", sglang=SGLangConfig(base_url=url)))  # fmt: skip
        return cfg.resolved_lora_push

    with pytest.raises(ValueError, match=r"learner.lora_rank=16 .*--max-lora-rank 8"):
        resolve(double.url, lora_rank=16, lora_targets=list(TARGETS))
    with pytest.raises(ValueError, match=r"learner.lora_targets \['down_proj'\] .*--lora-target-modules"):
        resolve(double.url, lora_rank=RANK, lora_targets=["q_proj", "down_proj"])
    with pytest.raises(ValueError, match=r"learner.lora_targets .*--lora-target-modules"):
        SGLangEngine(SGLangConfig(base_url=double.url), lora=LoraSpec(("down_proj",), 1.0))
    with SGLangDouble(load_format="auto") as off:
        with pytest.raises(ValueError, match="--enable-lora"):
            resolve(off.url, lora_rank=RANK, lora_push="adapter")
        with pytest.raises(ValueError, match="--enable-lora"):
            SGLangEngine(SGLangConfig(base_url=off.url), lora=LoraSpec(TARGETS, 1.0))
    with SGLangDouble(enable_lora=True, load_format="auto", weight_version="7") as pushed:  # its base was replaced by a full push
        with pytest.raises(ValueError, match="base weights"):
            SGLangEngine(SGLangConfig(base_url=pushed.url), lora=LoraSpec(TARGETS, 1.0))
    rig = Rig(double, tmp_path)
    try:  # a rank the server refuses, found when the tensors arrive: the update fails, nothing is loaded
        rig.sender.push(iter(adapters(seed=1, rank=16).items()), 1)
        assert not double.loras and rig.engine.weight_version == 0
    finally:
        rig.close()


def test_auto_resolves_to_adapter_only_on_a_server_with_lora(double):
    def auto(engine: str, url: str, **learner) -> str:
        ln = LearnerConfig(**{"lora_rank": RANK, "lora_targets": list(TARGETS), "lora_trainable": [], **learner})
        return RunConfig(learner=ln, generator=GeneratorConfig(engine=engine, sglang=SGLangConfig(base_url=url))
                         ).resolved_lora_push  # fmt: skip

    assert auto("sglang", double.url) == "adapter"
    assert auto("torch", double.url) == "adapter"
    # Trained norms (learner.lora_trainable, ["norm"] by default): SGLang's LoRA serving cannot load them.
    assert auto("sglang", double.url, lora_trainable=["norm"]) == "merged"
    assert auto("torch", double.url, lora_trainable=["norm"]) == "adapter"
    with pytest.raises(ValueError, match=r"learner.lora_push='adapter' .*learner.lora_trainable=\[\] \(now \['norm'\]\)"):
        auto("sglang", double.url, lora_trainable=["norm"], lora_push="adapter")
    with SGLangDouble() as off:
        assert auto("sglang", off.url) == "merged"
    assert RunConfig(learner=LearnerConfig(lora_rank=RANK, lora_push="merged", lora_targets=list(TARGETS)),
                     generator=GeneratorConfig(engine="sglang", sglang=SGLangConfig(base_url=double.url))
                     ).resolved_lora_push == "merged"  # fmt: skip
    assert RunConfig(generator=GeneratorConfig(engine="sglang")).resolved_lora_push == "full"
