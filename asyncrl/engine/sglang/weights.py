"""Weight-update calls of one SGLang server: the session (begin/end), the version label, the process
group for broadcasts, and the colocated CUDA-IPC path (docs/sglang-api.md §3, §4).

Protocol detection: SGLang >= 0.5.21 requires every update to run between /begin_weight_update and
/end_weight_update; <= 0.5.20 answers 404 there. The first begin probes it and a 404 marks the server
legacy, after which begin/end are skipped.
"""

from __future__ import annotations

import base64
import io
import logging
from collections.abc import Iterable

import torch

from asyncrl.engine.sglang.config import SGLangConfig
from asyncrl.engine.sglang.client import SGLangError, SGLangHTTP
from asyncrl.records import WeightBucket

log = logging.getLogger(__name__)


class SGLangWeightSync:
    def __init__(self, http: SGLangHTTP, config: SGLangConfig, server_label: str) -> None:
        self._http = http
        self._config = config
        self.legacy: bool | None = None  # None until the first begin probes the server
        self.server_label = server_label  # the version label the server reports now

    def begin(self) -> None:
        if self.legacy:
            return
        resp = self._http.call("/begin_weight_update", {}, timeout_s=self._config.request_timeout_s, allow=(404,))
        self.legacy = resp.status == 404
        if self.legacy:
            log.info("%s has no /begin_weight_update (SGLang <= 0.5.20): skipping begin/end", self._http.base_url)

    def end(self, version: int) -> None:
        """Label the new weights (unless a bucket already did), then close the session."""
        label = str(version)
        if self.server_label != label:
            self._http.call(
                "/update_weight_version",
                {"new_version": label, "abort_all_requests": False},  # the server's default aborts everything
                timeout_s=self._config.request_timeout_s,
            )
            self.server_label = label
        if not self.legacy:
            self._http.call("/end_weight_update", {}, timeout_s=self._config.request_timeout_s)

    def init_group(
        self, master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str, backend: str
    ) -> None:
        """Blocks until every receiving rank of the server and the learner's rank 0 have met."""
        payload = {
            "master_address": master_address,
            "master_port": int(master_port),
            "rank_offset": int(rank_offset),
            "world_size": int(world_size),
            "group_name": group_name,
            "backend": backend,
        }
        self._http.call("/init_weights_update_group", payload, timeout_s=self._config.weight_update_timeout_s)

    def destroy_group(self, group_name: str) -> None:
        payload = {"group_name": group_name}
        self._http.call("/destroy_weights_update_group", payload, timeout_s=self._config.request_timeout_s)

    def update_from_distributed(
        self,
        names: list[str],
        dtypes: list[str],
        shapes: list[list[int]],
        group_name: str,
        version: int,
        load_format: str | None,
    ) -> str:
        """Returns after the server has received the bucket's broadcast(s) and loaded them."""
        if not len(names) == len(dtypes) == len(shapes):
            raise ValueError(f"names/dtypes/shapes have lengths {len(names)}/{len(dtypes)}/{len(shapes)}: must match")
        payload = {
            "names": list(names),
            "dtypes": [d.removeprefix("torch.") for d in dtypes],  # SGLang wants getattr(torch, s) names
            "shapes": [[int(x) for x in s] for s in shapes],
            "group_name": group_name,
            "flush_cache": False,  # flushed separately while idle; a busy flush fails the call (§4.3)
            "abort_all_requests": False,
            "weight_version": str(version),
            "load_format": load_format,
        }
        resp = self._http.call(
            "/update_weights_from_distributed", payload, timeout_s=self._config.weight_update_timeout_s
        )
        self.server_label = str(version)
        return str((resp.json() or {}).get("message", ""))

    def receive_bucket(self, bucket: WeightBucket, group_name: str) -> str:
        """One asyncrl flat bucket: SGLang's "flattened_bucket" receives it in a single broadcast."""
        check_packed(bucket)
        return self.update_from_distributed(
            bucket.names, bucket.dtypes, bucket.shapes, group_name, bucket.version, "flattened_bucket"
        )

    def update_from_tensor(self, named_tensors: Iterable[tuple[str, torch.Tensor]], tp_size: int) -> None:
        """Colocated only: CUDA IPC handles of the tensors, one serialized copy per TP rank."""
        if not self._config.colocated:
            raise SGLangError(
                "SGLang loads weights inside its own scheduler processes, not in this one. Push them with "
                "update_weights_from_distributed(...) while the learner broadcasts on the group made by "
                "init_weights_update_group(...); load_weights(...) works only with sglang.colocated=true "
                "(learner and server on the same GPUs, CUDA IPC)."
            )
        tensors = [(name, t.detach().contiguous()) for name, t in named_tensors]
        cpu = [name for name, t in tensors if not t.is_cuda]
        if cpu:
            raise ValueError(f"colocated load_weights needs CUDA tensors (IPC handles); on CPU: {cpu[:3]}")
        blob = _serialize_for_ipc(tensors)
        payload = {"serialized_named_tensors": [blob] * tp_size, "flush_cache": False, "abort_all_requests": False}
        self._http.call("/update_weights_from_tensor", payload, timeout_s=self._config.weight_update_timeout_s)


def check_packed(bucket: WeightBucket) -> None:
    """SGLang reads a flattened bucket with no padding (off_0 = 0, off_i+1 = off_i + nbytes_i) and
    refuses misaligned or empty ones (§4.4). Checked before the HTTP call, so nothing hangs."""
    if not bucket.names:
        raise ValueError(f"weight bucket of version {bucket.version} is empty; SGLang cannot receive it")
    offset = 0
    for name, dtype, shape, got in zip(bucket.names, bucket.dtypes, bucket.shapes, bucket.offsets, strict=True):
        itemsize = getattr(torch, dtype.removeprefix("torch.")).itemsize
        if got != offset or offset % itemsize:
            raise ValueError(
                f"weight bucket tensor {name!r} at byte {got}: SGLang's flattened_bucket expects it packed at "
                f"byte {offset}, aligned to {itemsize}; group buckets by dtype and do not pad"
            )
        offset += torch.Size(shape).numel() * itemsize
    if offset != bucket.nbytes:
        raise ValueError(f"weight bucket declares {bucket.nbytes} bytes, its tensors hold {offset}")


def _serialize_for_ipc(obj: object) -> str:
    """Base64 of a ForkingPickler dump: torch's reductions turn CUDA tensors into IPC handles, which
    is what SGLang's receiving side unpickles. The tensors must stay alive until the call returns."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401  (registers the tensor reductions)

    buf = io.BytesIO()
    ForkingPickler(buf).dump(obj)
    return base64.b64encode(buf.getvalue()).decode()
