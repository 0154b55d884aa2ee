"""A GGUF model.path: converted once to an fp32 Hugging Face folder beside it, reused, reconverted when changed,
and checked by the launcher's preflight (one-line ConfigError for a bad file)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("gguf")

from tiny_gguf import CHAT_TEMPLATE, EOS, write_tiny_gguf  # noqa: E402

import asyncrl.models.gguf as gguf_cache  # noqa: E402
from asyncrl.config.loader import ConfigError  # noqa: E402
from asyncrl.models.config import ModelConfig, resolve_model_path  # noqa: E402
from launch.preflight import check_model  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, Path]:
    """(gguf file, its converted folder), converted once for the module."""
    g = write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    return g, Path(resolve_model_path(ModelConfig(path=str(g))))


@pytest.fixture
def conversions(monkeypatch) -> list[Path]:
    """Counts calls of the real conversion."""
    calls: list[Path] = []
    real = gguf_cache.convert

    def counted(g: Path, out: Path) -> None:
        calls.append(g)
        real(g, out)

    monkeypatch.setattr(gguf_cache, "convert", counted)
    return calls


def test_converted_folder_matches_the_gguf_loader(tiny):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    g, folder = tiny
    assert folder == g.with_name("tiny.hf")
    marker = json.loads((folder / "asyncrl_gguf.json").read_text())
    assert marker["sha256"] == gguf_cache.sha256(g) and marker["size"] == g.stat().st_size
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == EOS

    ours = AutoModelForCausalLM.from_pretrained(folder)
    direct = AutoModelForCausalLM.from_pretrained(g.parent, gguf_file=g.name, dtype=torch.float32)
    assert ours.dtype == torch.float32 and ours.config.tie_word_embeddings
    assert ours.lm_head.weight.data_ptr() == ours.model.embed_tokens.weight.data_ptr()
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.chat_template == CHAT_TEMPLATE and tok.eos_token_id == EOS
    ids = tok.apply_chat_template([{"role": "user", "content": "the cat?"}], add_generation_prompt=True)
    ids = torch.tensor([ids["input_ids"] if hasattr(ids, "keys") else ids])
    with torch.no_grad():
        assert torch.equal(ours(ids).logits, direct(ids).logits)


def test_torch_engine_generates_like_transformers_on_the_converted_llama(tiny):
    import numpy as np
    from transformers import AutoModelForCausalLM

    from asyncrl.engine.protocol import GenerationRequest
    from asyncrl.engine.torch.engine import TorchEngine
    from asyncrl.records import SamplingParams

    _, folder = tiny
    prompt = [1, 40, 50, 98, 60, 2]
    eng = TorchEngine(folder, dtype="float32", max_running=2, num_kv_blocks=16, kv_block_size=4)
    assert eng.model.cfg.architecture == "LlamaForCausalLM" and eng.model.cfg.tie_word_embeddings
    eng.add(GenerationRequest(request_id="r", prompt_token_ids=np.asarray(prompt, np.int32), n=1,
                              sampling=SamplingParams(max_new_tokens=6, temperature=0.0, ignore_eos=True)))
    outs = []
    while eng.has_work():
        outs += eng.step()
    hf = AutoModelForCausalLM.from_pretrained(folder)
    want = hf.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, min_new_tokens=6)[0, len(prompt):]
    assert outs[0].token_ids.tolist() == want.tolist()


def test_cache_is_reused_without_reconverting(tiny, conversions):
    g, folder = tiny
    assert resolve_model_path(ModelConfig(path=str(g))) == str(folder)  # size + mtime match: no hash
    os.utime(g, ns=(time.time_ns(), time.time_ns()))  # same bytes, new mtime: the sha256 decides
    assert resolve_model_path(ModelConfig(path=str(g))) == str(folder)
    assert conversions == []
    assert json.loads((folder / "asyncrl_gguf.json").read_text())["mtime_ns"] == g.stat().st_mtime_ns


def test_changed_gguf_is_reconverted(tmp_path, tiny, conversions):
    g = tmp_path / "tiny.gguf"
    shutil.copy(tiny[0], g)
    first = gguf_cache.converted(g)
    before = (first / "model.safetensors").read_bytes()
    write_tiny_gguf(g, seed=1)
    assert gguf_cache.converted(g) == first and len(conversions) == 2
    assert (first / "model.safetensors").read_bytes() != before
    assert json.loads((first / "asyncrl_gguf.json").read_text())["sha256"] == gguf_cache.sha256(g)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf", "tiny.hf", "tiny.hf.lock"]  # no leftovers


def test_folder_holding_one_gguf_resolves_to_its_conversion(tmp_path, tiny):
    shutil.copy(tiny[0], tmp_path / "m.gguf")
    assert resolve_model_path(ModelConfig(path=str(tmp_path))) == str(tmp_path / "m.hf")
    assert resolve_model_path(ModelConfig(path=str(tmp_path))) == str(tmp_path / "m.hf")  # a .hf folder inside
    shutil.copy(tiny[0], tmp_path / "n.gguf")
    with pytest.raises(gguf_cache.GGUFError, match="2 .gguf files"):
        resolve_model_path(ModelConfig(path=str(tmp_path)))


def test_concurrent_resolutions_convert_once(tmp_path, monkeypatch):
    g = tmp_path / "x.gguf"
    g.write_bytes(b"GGUF" + bytes(60))
    calls: list[int] = []

    def slow_fake(src: Path, out: Path) -> None:
        calls.append(1)
        time.sleep(0.2)
        (out / "config.json").write_text("{}")

    monkeypatch.setattr(gguf_cache, "convert", slow_fake)
    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(gguf_cache.converted(g))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [1] and results == [tmp_path / "x.hf"] * 3


def test_preflight_accepts_a_gguf(tiny, conversions, capsys):
    check_model(str(tiny[0]))
    assert conversions == [] and capsys.readouterr().err == ""


def test_preflight_refuses_a_corrupt_gguf_in_one_line(tmp_path, tiny):
    bad = tmp_path / "bad.gguf"
    bad.write_text("<html>rate limited</html>")
    with pytest.raises(ConfigError) as e:
        check_model(str(bad))
    assert "model.path=" in str(e.value) and "not a GGUF file" in str(e.value) and "\n" not in str(e.value)
    cut = tmp_path / "cut" / "cut.gguf"
    cut.parent.mkdir()
    cut.write_bytes(tiny[0].read_bytes()[:1000])  # a header, then nothing
    with pytest.raises(ConfigError) as e:
        check_model(str(cut))
    assert "model.path=" in str(e.value) and "cannot load cut.gguf" in str(e.value) and "\n" not in str(e.value)
    assert not (cut.parent / "cut.hf").exists()


def test_launcher_exits_2_on_a_corrupt_gguf(tmp_path, capsys):
    from launch.__main__ import main

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"\x00" * 64)
    assert main(["--set", f"model.path={bad}", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model.path=" in err and "not a GGUF" in err
    assert not (tmp_path / "r").exists()
