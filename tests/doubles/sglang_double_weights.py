"""The double's weight-update endpoints: the begin/end session, process groups, and receiving
broadcasts (docs/sglang.md, "Weight updates"). Handlers take the double and a JSON body and return
(status, payload); the state they change lives on `SGLangDouble`.

A duplicate group name fails as in SGLang: the ranks go through the TCP rendezvous first and torch then
refuses the name, so the learner's side has met the ranks and waits for a group that never forms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from tests.doubles.sglang_double_generate import BadRequest

if TYPE_CHECKING:
    from tests.doubles.sglang_double import SGLangDouble

NOT_FOUND = (404, {"detail": "Not Found"})
SESSION_REQUIRED = "{} must run between begin_weight_update() and end_weight_update()"
PARTIAL_LOAD = (
    "Failed to update parameter online: {}. The full weights of the ModelRunner are partially updated. "
    "Please discard the whole weights."
)
FLUSH_FAILED_AFTER_UPDATE = (
    "Weights were updated, but the cache was not flushed because requests are still running or queued. "
    "Retract or finish them, then call /flush_cache."
)


def begin(d: SGLangDouble, body: dict) -> tuple[int, Any]:
    if d.config.version_mode == "legacy":
        return NOT_FOUND
    if body.get("selector", "all") not in ("all", "target", "draft"):
        raise BadRequest(f"selector must be 'all', 'target' or 'draft', got {body.get('selector')!r}")
    with d.writer_lock(), d.cond:
        if d.session_open:
            return 400, _fail("a weight-update session is already open; call end_weight_update() first")
        d.session_open, d.session_loaded = True, False
    return 200, {"success": True, "message": "Weight-update session opened."}


def end(d: SGLangDouble, body: dict) -> tuple[int, Any]:
    if d.config.version_mode == "legacy":
        return NOT_FOUND
    with d.writer_lock(), d.cond:
        if not d.session_open:
            return 400, _fail("no weight-update session is open; call begin_weight_update() first")
        d.session_open = False
    return 200, {"success": True, "message": "Weight-update session closed."}


def init_group(d: SGLangDouble, body: dict) -> tuple[int, Any]:
    try:
        kw = {"master_address": str(body["master_address"]), "master_port": int(body["master_port"]),
                  "rank_offset": int(body["rank_offset"]), "world_size": int(body["world_size"]),
                  "group_name": str(body.get("group_name", "weight_update_group")),
                  "backend": str(body.get("backend", "nccl"))}  # fmt: skip
    except (KeyError, TypeError, ValueError) as e:
        return 400, _fail(f"invalid init_weights_update_group request: {e!r}")
    if kw["rank_offset"] < 1 or kw["world_size"] < kw["rank_offset"] + d.config.tp_size:
        return 400, _fail(
            f"rank_offset {kw['rank_offset']} + tp_size {d.config.tp_size} > world_size {kw['world_size']}"
        )
    try:
        d.ranks.init_group(**kw)
    except RuntimeError as e:
        return 400, _fail(f"Failed to initialize custom process group: {e}")
    with d.cond:
        d.groups.add(kw["group_name"])
    return 200, {"success": True, "message": "Succeeded to initialize custom process group."}


def destroy_group(d: SGLangDouble, body: dict) -> tuple[int, Any]:
    name = str(body.get("group_name", "weight_update_group"))
    if name not in d.groups:
        return 400, _fail("The group to be destroyed does not exist.")
    d.ranks.destroy(name)
    with d.cond:
        d.groups.discard(name)
    return 200, {"success": True, "message": "Succeeded to destroy custom process group."}


def update_distributed(d: SGLangDouble, body: dict) -> tuple[int, Any]:
    names, dtypes, shapes = body.get("names"), body.get("dtypes"), body.get("shapes")
    if not (isinstance(names, list) and isinstance(dtypes, list) and isinstance(shapes, list)) or not (
        len(names) == len(dtypes) == len(shapes)
    ):
        return 400, _fail("names, dtypes and shapes must be lists of equal length")
    group, fmt = str(body.get("group_name", "weight_update_group")), body.get("load_format")
    with d.writer_lock():
        if d.config.version_mode == "0.5.23" and not d.session_open:
            return 400, _fail(SESSION_REQUIRED.format("update_weights_from_distributed"))
        try:
            dts = _check_metadata(names, dtypes, shapes, fmt, group in d.groups, group)
            tensors = d.ranks.receive(group, dts, shapes, flattened=fmt == "flattened_bucket")
        except (ValueError, TypeError, RuntimeError) as e:
            return 400, _fail(PARTIAL_LOAD.format(e))
        return _loaded(d, list(zip(names, tensors, strict=True)), body)


def _loaded(d: SGLangDouble, named: list[tuple[str, torch.Tensor]], body: dict) -> tuple[int, Any]:
    """Store received weights, apply weight_version and the update's flush_cache."""
    version = body.get("weight_version")
    with d.cond:
        for name, t in named:
            if d.config.param_names is not None and name not in d.config.param_names:
                d.warnings.append(f"Parameter {name} not found in params_dict")
            else:
                d.weights[name] = t.clone()
        d.session_loaded, d.prefix_cache_dirty, d.weights_garbage = True, True, False
        if version is not None:
            d.version = str(version)  # later tokens of live requests get the new version
        if body.get("flush_cache", True):
            if d.in_flight or d.paused == "in_place":
                return 400, _fail(FLUSH_FAILED_AFTER_UPDATE)
            d.prefix_cache.clear()
            d.prefix_cache_dirty = False
    message = "Succeeded to update parameter online."
    return 200, {
        "success": True,
        "message": message + (f" Weight version updated to {version}." if version else ""),
    }


def update_tensor(d: SGLangDouble, body: dict) -> tuple[int, Any]:
    if d.config.version_mode == "0.5.23" and not d.session_open:
        return 400, _fail(SESSION_REQUIRED.format("update_weights_from_tensor"))
    return 400, _fail("the test double cannot open CUDA IPC handles")


def _check_metadata(
    names: list, dtypes: list, shapes: list, fmt: Any, known_group: bool, group: str
) -> list[torch.dtype]:
    """Validate like SGLang's receiver does before it enters any broadcast (§4.4)."""
    if not known_group:
        raise ValueError(f"process group {group!r} does not exist; call init_weights_update_group first")
    if fmt not in (None, "flattened_bucket"):
        raise ValueError(f"unsupported load_format {fmt!r}")
    dts = []
    for d in dtypes:
        dt = getattr(torch, str(d), None)
        if not isinstance(dt, torch.dtype):
            raise TypeError(f"module 'torch' has no attribute '{d}'")
        dts.append(dt)
    if any(not isinstance(s, list) or any(not isinstance(x, int) or x < 0 for x in s) for s in shapes):
        raise ValueError(f"shapes must be lists of non-negative ints, got {shapes}")
    if fmt == "flattened_bucket":
        if not names:
            raise ValueError("Cannot create empty tensor bucket")
        offset = 0
        for name, s, dt in zip(names, shapes, dts, strict=True):
            if offset % dt.itemsize:
                raise ValueError(
                    f"Unaligned received tensor {name}: offset {offset} is not a multiple of {dt.itemsize}"
                )
            offset += torch.Size(s).numel() * dt.itemsize
    return dts


def _fail(message: str) -> dict[str, Any]:
    return {"success": False, "message": message}


ROUTES = {
    "/begin_weight_update": begin,
    "/end_weight_update": end,
    "/init_weights_update_group": init_group,
    "/destroy_weights_update_group": destroy_group,
    "/update_weights_from_distributed": update_distributed,
    "/update_weights_from_tensor": update_tensor,
}
