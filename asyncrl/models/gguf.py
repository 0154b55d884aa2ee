"""A GGUF checkpoint turned, once, into the Hugging Face folder every component loads.

    X.gguf  ->  X.hf/        config.json, model.safetensors (fp32), tokenizer files with the chat
                             template, generation_config.json, asyncrl_gguf.json (the marker)
                X.hf.lock    fcntl lock held while one process checks or converts

`find_gguf(path)` says whether model.path names a GGUF (a `.gguf` file, or a folder without
config.json that holds exactly one). `converted(gguf)` returns X.hf, converting first when the
folder is missing or its marker does not match the file. Several processes may resolve at once:
the first takes the lock and converts into a temporary folder beside X.hf, then renames it into
place; the others wait on the lock and find the folder done. A reader that finds a marker whose
size and mtime match the file returns without the lock or a hash (the launcher's children, after
preflight converted); otherwise the file's sha256 decides.

Weights are dequantized by transformers' own GGUF loader and stored in fp32: a Q4_1 value is
d*q + m with fp16 d and m and a 4-bit q, up to ~15 significant bits before the add, which bf16
(8 bits) rounds (31 % of SmolLM2-135M's q_proj values survive bf16, measured); fp32 holds what
the loader computed. The compute dtype (model.dtype) rounds at load time as for any folder, while
the learner's fp32 master weights start from the exact dequantized values.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

log = logging.getLogger(__name__)

MARKER = "asyncrl_gguf.json"
SUFFIX = ".hf"


class GGUFError(ValueError):
    """A GGUF that cannot be found, read or converted; the message is one line with the fix."""


def find_gguf(path: str | os.PathLike) -> Path | None:
    """The GGUF file `path` names, or None when it names something else (a Hugging Face folder)."""
    p = Path(path).expanduser()
    if p.is_file():
        return p if p.suffix == ".gguf" else None
    if not p.is_dir() or (p / "config.json").exists():
        return None
    files = sorted(p.glob("*.gguf"))
    if len(files) > 1:
        raise GGUFError(f"{p} holds {len(files)} .gguf files ({', '.join(f.name for f in files[:4])}): "
                        "name one file")
    return files[0] if files else None


def converted_folder(gguf: Path) -> Path:
    """Where `gguf`'s Hugging Face folder lives: X.gguf -> X.hf beside it."""
    return gguf.with_name(gguf.stem + SUFFIX)


def converted(gguf: Path, say: Callable[[str], None] = log.info) -> Path:
    """X.hf for `gguf`, converted first unless its marker matches (see the module docstring)."""
    gguf = gguf.resolve()
    target = converted_folder(gguf)
    if _fast_match(gguf, target):
        return target
    with _locked(target.with_name(target.name + ".lock")):
        _remove_leftovers(target)
        digest = sha256(gguf)
        marker = _read_marker(target)
        if marker is not None and marker.get("sha256") == digest:
            _write_marker(target, _marker(gguf, digest))  # same bytes, new mtime: keep the fast path
            return target
        if target.exists() and marker is None:
            raise GGUFError(f"{target} exists but was not made by asyncrl (no {MARKER}): move it away")
        check_header(gguf)
        say(f"converting {gguf.name} ({gguf.stat().st_size / 1e6:.0f} MB) to {target} "
            "(dequantized to fp32, once; later runs reuse it)")
        _convert_into_place(gguf, target, digest)
    return target


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def check_header(gguf: Path) -> None:
    """Fail fast (before the slow loader) on a file that is not GGUF at all: a wrong download, a text file."""
    with open(gguf, "rb") as f:
        head = f.read(4)
    if head != b"GGUF":
        raise GGUFError(f"{gguf.name} is not a GGUF file (it starts with {head!r}, not b'GGUF')")
    if importlib.util.find_spec("gguf") is None:
        raise GGUFError("reading a GGUF needs the gguf package: pip install gguf")


def convert(gguf: Path, out: Path) -> None:
    """Dequantize `gguf` with transformers' loader and save model, tokenizer and generation config to `out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as e:  # noqa: BLE001 - a bad file raises ValueError, KeyError, struct.error, OSError ...
        raise GGUFError(f"transformers cannot load {gguf.name} as GGUF ({_first_line(e)})") from None
    _drop_quantization(model)
    gen = model.generation_config
    if gen.eos_token_id is None:
        gen.eos_token_id = tokenizer.eos_token_id
    if gen.pad_token_id is None:
        gen.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else gen.eos_token_id
    model.save_pretrained(str(out))  # tied embeddings: lm_head is not stored, tie_word_embeddings stays set
    tokenizer.save_pretrained(str(out))


def _drop_quantization(model: Any) -> None:
    """The weights are plain fp32 now; a kept quantization_config would send the folder back to the GGUF loader."""
    for obj, attr in ((model.config, "quantization_config"), (model, "hf_quantizer")):
        if getattr(obj, attr, None) is not None:
            try:
                delattr(obj, attr)
            except AttributeError:
                setattr(obj, attr, None)
    model.is_quantized = False


def _convert_into_place(gguf: Path, target: Path, digest: str) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    old = target.with_name(f".{target.name}.old")
    try:
        convert(gguf, tmp)
        _write_marker(tmp, _marker(gguf, digest))
        os.chmod(tmp, 0o755)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)  # safetensors writes 0600: other users of a shared cache must read it
        if target.exists():
            os.rename(target, old)
        os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)


def _marker(gguf: Path, digest: str) -> dict[str, Any]:
    import transformers

    st = gguf.stat()
    return {"gguf": gguf.name, "sha256": digest, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "dtype": "float32", "transformers": transformers.__version__}


def _write_marker(folder: Path, marker: dict[str, Any]) -> None:
    tmp = folder / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(marker, indent=2) + "\n")
    os.replace(tmp, folder / MARKER)


def _read_marker(folder: Path) -> dict[str, Any] | None:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None


def _fast_match(gguf: Path, target: Path) -> bool:
    marker = _read_marker(target)
    st = gguf.stat()
    return marker is not None and marker.get("size") == st.st_size and marker.get("mtime_ns") == st.st_mtime_ns


def _remove_leftovers(target: Path) -> None:
    """Temporary folders of a conversion that died (we hold the lock, so none is in use)."""
    for p in target.parent.glob(f".{target.name}.tmp-*"):
        shutil.rmtree(p, ignore_errors=True)


@contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    try:
        f = open(lock_path, "a")
    except OSError as e:
        raise GGUFError(f"cannot write beside the GGUF ({lock_path}: {e.strerror}): "
                        "copy the .gguf into a writable folder") from None
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)  # waits while another process converts
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
