"""Adapter-only LoRA pushes into an SGLang server (`learner.lora_push = "adapter"`; docs/sglang.md, "LoRA
adapters"): the server keeps its own base and applies each version's adapters through its LoRA serving.

Per version v: the learner broadcasts A and B (fp32, MBs) to this process, which writes them as a PEFT
folder `<sglang.lora_dir>/<name>/` (adapter_config.json + adapter_model.safetensors) and POSTs
/load_lora_adapter {lora_name: name, lora_path: folder}, name = `asyncrl-<tag>-v<v>` (tag: random per
engine, so a restarted generator never collides with a name its predecessor left). From then on every
/generate names it in `lora_path`. The previous version is retired: unloaded (/unload_lora_adapter) once no
/generate this engine sent under it is still in flight, then its folder is deleted.

Concurrency:

    weight receiver thread    join / receive (this process is the group's only receiving rank) ─► pending
                              publish(v): write folder, load ──► swap `active` under the lock, retire old
    generate workers          acquire() at send ─► /generate {lora_path} ─► release(); the release that
                              leaves a retired adapter unused unloads it (HTTP from that worker thread)

We rely on our own count, not on SGLang's: SGLang's unload drops the name at once (new requests naming it
fail) and then waits for its in-flight requests, holding the lock every LoRA load takes, so an unload sent
while a paused request still used the adapter would stall the next version's load.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from asyncrl.engine.bucket_layout import BucketLayout, unflatten
from asyncrl.engine.sglang.client import SGLangConnectionError, SGLangError, SGLangHTTP, error_message
from asyncrl.engine.sglang.config import SGLangConfig
from asyncrl.engine.torch.adapter_merge import LoraSpec
from asyncrl.models.peft_adapter import PeftAdapter, peft_config, peft_state_dict, write_adapter
from asyncrl.records import WeightBucket, WeightGroupInit

log = logging.getLogger(__name__)

ADAPTERS = ("lora_A", "lora_B")
FUSED = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
         "up_proj": "gate_up_proj"}  # fmt: skip
"""SGLang serves q/k/v and gate/up as fused layers; `--lora-target-modules` may name either form."""


class Channel(Protocol):
    """A weight group joined as its one receiving rank (asyncrl.weights.transport.BroadcastTransport)."""

    kind: str  # "nccl" | "gloo"

    def post(self, bucket: WeightBucket, device: torch.device) -> Any:
        """Start receiving one bucket; `.result(timeout_s)` -> its bytes, uint8 [nbytes] on `device`."""

    def close(self) -> None: ...


JoinChannel = Callable[[WeightGroupInit, float], Channel]  # (the group's init, timeout_s) -> a joined channel


@dataclass(frozen=True, slots=True)
class ServerLora:
    """What /server_info says about the server's LoRA serving (None: inferred from --lora-paths, not known)."""

    enabled: bool
    max_rank: int | None
    targets: frozenset[str] | None

    @classmethod
    def of(cls, info: dict[str, Any]) -> ServerLora:
        rank, targets = info.get("max_lora_rank"), info.get("lora_target_modules")
        return cls(enabled=bool(info.get("enable_lora")), max_rank=int(rank) if rank else None,
                   targets=frozenset(targets) if targets else None)  # fmt: skip


def check_fits(server: ServerLora, rank: int | None, targets: Sequence[str], url: str) -> None:
    """ValueError (one line: the key and the server flag) when the server cannot take these adapters."""
    if not server.enabled:
        raise ValueError(f"learner.lora_push='adapter' but the SGLang server at {url} runs without --enable-lora: "
                         "restart it with --enable-lora (and --max-lora-rank, --lora-target-modules) or set "
                         "learner.lora_push = \"merged\"")
    if server.max_rank is not None and rank is not None and rank > server.max_rank:
        raise ValueError(f"learner.lora_rank={rank} is above the SGLang server's --max-lora-rank {server.max_rank} "
                         f"({url}): restart it with --max-lora-rank {rank} or lower learner.lora_rank")
    missing = [t for t in targets if not served(t, server.targets)]
    if missing:
        raise ValueError(f"learner.lora_targets {missing} are not in the SGLang server's --lora-target-modules "
                         f"{sorted(server.targets or ())} ({url}): restart it with --lora-target-modules "
                         f"{' '.join(targets)} or drop them from learner.lora_targets")


def served(target: str, server_targets: frozenset[str] | None) -> bool:
    if server_targets is None or "all" in server_targets:
        return True
    return target in server_targets or FUSED.get(target) in server_targets


def resolve_push(config: SGLangConfig, lora_push: str, rank: int, targets: Sequence[str],
                 trainable: Sequence[str] = ()) -> str:
    """learner.lora_push "auto" / "adapter" against the server: "adapter" when it serves LoRA and the learner's
    adapters fit (ValueError when they do not), "merged" for "auto" on a server without --enable-lora or one
    not reachable (within sglang.startup_wait_s: the engine waits as long, then fails to start). With
    `trainable` (learner.lora_trainable) non-empty: "merged" for "auto" and a ValueError for "adapter", without
    asking the server, since its LoRA serving loads adapters onto a frozen base and cannot take trained norms."""
    if trainable:
        if lora_push == "adapter":
            raise ValueError(f"learner.lora_push='adapter' with SGLang needs learner.lora_trainable=[] (now "
                             f"{list(trainable)}): SGLang's LoRA serving cannot load trained base tensors; "
                             "set learner.lora_trainable=[] or learner.lora_push='merged'")
        log.info("learner.lora_push='auto': learner.lora_trainable=%s trains base tensors SGLang's LoRA serving "
                 "cannot load, so pushes carry merged weights", list(trainable))
        return "merged"
    try:
        server = ServerLora.of(_server_info(SGLangHTTP(config.base_url, config.api_key), config))
    except SGLangConnectionError as e:
        if lora_push == "adapter":
            return "adapter"  # the engine checks the server when it starts
        log.warning("learner.lora_push='auto': SGLang server not reachable (%s); pushing merged weights", e)
        return "merged"
    if lora_push == "auto" and not server.enabled:
        log.info("learner.lora_push='auto': %s runs without --enable-lora, so pushes carry merged weights",
                 config.base_url)
        return "merged"
    check_fits(server, rank, targets, config.base_url)
    return "adapter"


@dataclass(slots=True)
class Lease:
    """The adapter one /generate was sent under (name None: the base, version 0 before any push)."""

    name: str | None
    version: int


@dataclass(slots=True)
class _Loaded:
    name: str
    version: int
    folder: Path
    in_flight: int = 0
    retired: bool = False


@dataclass(slots=True)
class _Inbox:
    """This process as the weight group's receiving rank (rank 1 of 2): adapters are small, one at a time."""

    transport: Channel
    timeout_s: float
    pending: dict[str, torch.Tensor] = field(default_factory=dict)  # HF module path + .lora_A/B -> fp32 CPU
    base: int = 0  # base tensors received in this update (a join push): the server keeps its own


class SGLangAdapters:
    def __init__(self, http: SGLangHTTP, config: SGLangConfig, spec: LoraSpec, server_info: dict[str, Any],
                 model_info: dict[str, Any], channel: JoinChannel | None = None) -> None:
        """Raises ValueError when the server cannot serve these targets or its base is not the model folder's (the
        rank, which the spec does not carry, is checked against --max-lora-rank with each version's tensors).
        `channel(init, timeout_s)` joins a weight group as its one receiving rank (the generator hands in
        asyncrl.weights.transport.join_as_receiver: the weight group lives above the engines)."""
        self._http, self._config, self._spec, self._channel = http, config, spec, channel
        self._server = ServerLora.of(server_info)
        check_fits(self._server, None, spec.targets, config.base_url)
        _check_base(model_info, config.base_url)
        self._base_path = str(model_info.get("model_path") or "")
        self._dir = Path(config.lora_dir or Path(tempfile.gettempdir()) / "asyncrl-sglang-lora")
        self._tag = uuid.uuid4().hex[:8]
        self._lock = threading.Lock()
        self._active: _Loaded | None = None
        self._retired: list[_Loaded] = []
        self._inbox: _Inbox | None = None

    # ---------------------------------------------------------------- receiving (weight receiver thread)

    def join(self, init: WeightGroupInit, timeout_s: float) -> None:
        if init.world_size != 2 or init.rank_offset != 1:
            raise SGLangError(f"group {init.group_name}: adapter pushes have one receiving rank (this process), "
                              f"got rank_offset={init.rank_offset} world_size={init.world_size}")
        if self._channel is None:
            raise SGLangError("adapter pushes need a channel to receive on: build SGLangEngine with adapter_channel "
                              "(asyncrl.weights.transport.join_as_receiver)")
        self.leave()
        self._inbox = _Inbox(self._channel(init, timeout_s), timeout_s)

    def receive(self, bucket: WeightBucket) -> None:
        """One bucket's broadcast; adapter tensors are kept for `publish`, base tensors counted and dropped."""
        inbox = self._inbox
        if inbox is None:
            raise SGLangError("receive_bucket before init_weights_group: no weight group to receive on")
        device = torch.device("cuda", torch.cuda.current_device()) if inbox.transport.kind == "nccl" else torch.device("cpu")
        flat = inbox.transport.post(bucket, device).result(inbox.timeout_s)
        for name, t in unflatten(flat, BucketLayout.of(bucket)):
            if name.rsplit(".", 1)[-1] in ADAPTERS:
                inbox.pending[name] = t.to("cpu", torch.float32, copy=True)
            else:
                inbox.base += 1

    def leave(self) -> None:
        inbox, self._inbox = self._inbox, None
        if inbox is not None:
            inbox.transport.close()

    # ---------------------------------------------------------------- switching versions

    def publish(self, version: int) -> None:
        """Load this update's adapters as version `version` and send new requests to it; retire the old one."""
        inbox = self._inbox
        adapters = dict(inbox.pending) if inbox is not None else {}
        base = inbox.base if inbox is not None else 0
        if inbox is not None:
            inbox.pending, inbox.base = {}, 0
        if not adapters:
            raise SGLangError(f"update to v{version} carried {base} base tensors and no LoRA adapters: the learner "
                              "pushed merged weights to a generator in adapter mode (learner.lora_push resolved "
                              "differently in the two processes?); set learner.lora_push explicitly")
        if base:
            log.info("v%d: %d base tensors ignored: the server keeps the base it loaded from its model folder",
                     version, base)
        loaded = self._load(version, adapters)
        with self._lock:
            old, self._active = self._active, loaded
            if old is not None:
                old.retired = True
                self._retired.append(old)
        self._unload_unused()

    def acquire(self) -> Lease:
        """The adapter a /generate sent now uses (counted until `release`)."""
        with self._lock:
            if self._active is None:
                return Lease(None, 0)
            self._active.in_flight += 1
            return Lease(self._active.name, self._active.version)

    def release(self, lease: Lease) -> None:
        if lease.name is None:
            return
        with self._lock:
            for a in [self._active, *self._retired]:
                if a is not None and a.name == lease.name:
                    a.in_flight -= 1
        self._unload_unused()

    def close(self) -> None:
        """Unload every adapter this engine loaded (best effort) and delete their folders."""
        self.leave()
        with self._lock:
            every = [*self._retired, *([self._active] if self._active else [])]
            self._retired, self._active = [], None
        for a in every:
            self._unload(a)

    @property
    def active_name(self) -> str | None:
        with self._lock:
            return None if self._active is None else self._active.name

    # ---------------------------------------------------------------- internals

    def _load(self, version: int, adapters: dict[str, torch.Tensor]) -> _Loaded:
        name = f"asyncrl-{self._tag}-v{version}"
        folder = self._dir / name
        ranks = {int(t.shape[0]) for n, t in adapters.items() if n.endswith(".lora_A")}
        if len(ranks) != 1:
            raise SGLangError(f"v{version}: lora_A tensors of ranks {sorted(ranks)}; expected one rank")
        rank = ranks.pop()
        check_fits(self._server, rank, self._spec.targets, self._config.base_url)
        shutil.rmtree(folder, ignore_errors=True)
        config = peft_config(self._spec.targets, rank, self._spec.scale * rank, 0.0, self._base_path)
        write_adapter(PeftAdapter(peft_state_dict(adapters), config), folder)
        resp = self._call("/load_lora_adapter", {"lora_name": name, "lora_path": str(folder)})
        if resp is not None:
            shutil.rmtree(folder, ignore_errors=True)
            raise SGLangError(f"SGLang {self._http.base_url}/load_lora_adapter refused v{version} ({name}): {resp}")
        return _Loaded(name, version, folder)

    def _unload_unused(self) -> None:
        with self._lock:
            done = [a for a in self._retired if a.in_flight <= 0]
            self._retired = [a for a in self._retired if a.in_flight > 0]
        for a in done:
            self._unload(a)

    def _unload(self, a: _Loaded) -> None:
        """Unload, then delete the folder (kept when the unload failed: SGLang may re-read it)."""
        try:
            error = self._call("/unload_lora_adapter", {"lora_name": a.name})
        except SGLangError as e:
            error = str(e)
        if error is not None:
            log.warning("SGLang %s: unloading LoRA adapter %s failed: %s; its folder %s is kept",
                        self._http.base_url, a.name, error, a.folder)
            return
        shutil.rmtree(a.folder, ignore_errors=True)

    def _call(self, path: str, payload: dict[str, Any]) -> str | None:
        """POST a LoRA control call -> None on success, else the server's message (its `error_message`)."""
        resp = self._http.call(path, payload, timeout_s=self._config.request_timeout_s, allow=(400,))
        body = resp.json() if "json" in resp.content_type else None
        if resp.status < 400 and (not isinstance(body, dict) or body.get("success", True)):
            return None
        if isinstance(body, dict) and body.get("error_message"):
            return str(body["error_message"])
        return error_message(resp)


def _check_base(model_info: dict[str, Any], url: str) -> None:
    """Adapter pushes never send the base: the server must hold its model folder's weights, untouched."""
    from asyncrl.engine.sglang.generate import version_number
    from asyncrl.engine.sglang.weights import INCOMPLETE

    label = model_info.get("weight_version")
    if model_info.get("load_format") == "dummy" or label == INCOMPLETE or version_number(label) != 0:
        raise ValueError(f"learner.lora_push='adapter' needs the SGLang server at {url} to hold the base weights it "
                         f"loaded from its --model-path (adapter pushes never send the base), but its weights were "
                         f"replaced or never loaded (label {label!r}, load_format {model_info.get('load_format')!r}); "
                         "restart it from the learner's model folder without --load-format dummy")


def _server_info(http: SGLangHTTP, config: SGLangConfig) -> dict[str, Any]:
    """GET /server_info, retried for `startup_wait_s` while the server starts (the engine waits as long)."""
    deadline = time.monotonic() + config.startup_wait_s
    while True:
        try:
            info = http.call("/server_info", None, method="GET", timeout_s=config.request_timeout_s).json()
            return info if isinstance(info, dict) else {}
        except SGLangConnectionError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.5)
