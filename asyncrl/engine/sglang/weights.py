"""Weight-update calls of one SGLang server: the begin/end session, the version label, and the process
group its scheduler ranks receive broadcasts on (docs/sglang.md, "Weight updates" and "Failures").

Protocol detection: SGLang >= 0.5.21 requires every update to run between /begin_weight_update and
/end_weight_update; <= 0.5.20 answers 404 there. The first begin probes it and a 404 marks the server
legacy, after which begin/end are skipped.

Recovery by construction (a generator may die at any point of an update; the server keeps its state):
* `recover()` runs when the adapter starts: it ends a session a dead client left open (its weights are
  a mix of two versions, so the label becomes `INCOMPLETE`, version 0, and the learner pushes in full),
  and continues generation a dead client left paused.
* `begin()` answered "already open" ends that stale session and begins again.
* `init_group()` first destroys a group of the same name (left by an earlier incarnation), and reports
  a name collision as `SGLangGroupError`, which the weight receiver answers by joining again.

Not thread-safe: the weight receiver's thread is the only caller.
"""

from __future__ import annotations

import logging

from asyncrl.engine.bucket_layout import BucketLayout
from asyncrl.engine.sglang.client import Response, SGLangError, SGLangHTTP, SGLangHTTPError, error_message
from asyncrl.engine.sglang.config import SGLangConfig
from asyncrl.records import WeightBucket

log = logging.getLogger(__name__)

INCOMPLETE = "asyncrl-incomplete"
"""Version label of weights an interrupted update left behind (asyncrl reads it as version 0)."""
_ALREADY_OPEN = "already open"
_NAME_TAKEN = "already been created"
_NO_SUCH_GROUP = "does not exist"


class SGLangGroupError(SGLangError):
    """The server refused to join a weight group; the receiver should report it and join again."""


class SGLangWeightSync:
    def __init__(self, http: SGLangHTTP, config: SGLangConfig, server_label: str) -> None:
        self._http = http
        self._config = config
        self.legacy: bool | None = None  # None until the first begin (or recover) probes the server
        self.server_label = server_label  # the version label the server reports now

    def recover(self) -> bool:
        """End a session and a pause a dead client left behind. True when a session was open (its
        weights are then labelled INCOMPLETE)."""
        resp = self._call("/end_weight_update", {}, allow=(400, 404))
        self.legacy = resp.status == 404
        was_open = resp.status < 400
        if was_open:
            log.warning("%s: ended a weight-update session left open; weights incomplete until the next push",
                        self._http.base_url)
            self._label(INCOMPLETE, abort_all=True)  # requests would mix two policies: stop them
        self._call("/continue_generation", {})
        return was_open

    def begin(self) -> None:
        if self.legacy:
            return
        resp = self._call("/begin_weight_update", {}, allow=(400, 404))
        self.legacy = resp.status == 404
        if resp.status == 400:
            self._end_stale(SGLangHTTPError(self._http.base_url + "/begin_weight_update", 400, error_message(resp)))
            self._call("/begin_weight_update", {})
        if self.legacy:
            log.info("%s has no /begin_weight_update (SGLang <= 0.5.20): skipping begin/end", self._http.base_url)

    def end(self, version: int) -> None:
        """Label the new weights (unless a bucket already did), then close the session."""
        label = str(version)
        if self.server_label != label:
            self._label(label, abort_all=False)  # the server's default aborts everything
        if not self.legacy:
            self._call("/end_weight_update", {})

    def init_group(
        self, master_address: str, master_port: int, rank_offset: int, world_size: int, group_name: str, backend: str
    ) -> None:
        """Blocks until every receiving rank of the server and the learner's rank 0 have met."""
        self._destroy_stale(group_name)
        payload = {
            "master_address": master_address,
            "master_port": int(master_port),
            "rank_offset": int(rank_offset),
            "world_size": int(world_size),
            "group_name": group_name,
            "backend": backend,
        }
        try:
            self._http.call("/init_weights_update_group", payload, timeout_s=self._config.weight_update_timeout_s)
        except SGLangHTTPError as e:
            if _NAME_TAKEN in e.message:
                raise SGLangGroupError(
                    f"SGLang {self._http.base_url} already holds a weight group named {group_name!r} (created "
                    "by another client during this join); the learner must offer a fresh name: join again"
                ) from e
            raise SGLangGroupError(f"SGLang {self._http.base_url} could not join weight group {group_name!r}: "
                                   f"{e.message}; join again") from e

    def destroy_group(self, group_name: str) -> None:
        self._call("/destroy_weights_update_group", {"group_name": group_name})

    def receive_bucket(self, bucket: WeightBucket, group_name: str) -> str:
        """One asyncrl flat bucket, received by SGLang's ranks in a single "flattened_bucket" broadcast;
        returns after the server has received and loaded it."""
        # SGLang's flattened_bucket is our layout (no padding, offsets aligned per dtype); a bad one fails here,
        # before the HTTP call, so no rank waits on a broadcast that never comes.
        BucketLayout.of(bucket).validate()
        payload = {
            "names": list(bucket.names),
            "dtypes": list(bucket.dtypes),  # validated: getattr(torch, s) names, as SGLang wants
            "shapes": [[int(x) for x in s] for s in bucket.shapes],
            "group_name": group_name,
            "flush_cache": False,  # flushed separately while idle; a busy flush fails the call
            "abort_all_requests": False,
            "weight_version": str(bucket.version),
            "load_format": "flattened_bucket",
        }
        resp = self._http.call(
            "/update_weights_from_distributed", payload, timeout_s=self._config.weight_update_timeout_s
        )
        self.server_label = str(bucket.version)
        return str((resp.json() or {}).get("message", ""))

    # ---------------------------------------------------------------- internals

    def _end_stale(self, error: SGLangHTTPError) -> None:
        if _ALREADY_OPEN not in error.message:
            raise error
        log.warning("%s: a weight-update session was left open (a client died mid-update); ending it",
                    self._http.base_url)
        self._call("/end_weight_update", {})

    def _destroy_stale(self, group_name: str) -> None:
        resp = self._call("/destroy_weights_update_group", {"group_name": group_name}, allow=(400,))
        if resp.status < 400:
            log.warning("%s: destroyed a stale weight group %r before joining it again", self._http.base_url,
                        group_name)
        elif _NO_SUCH_GROUP not in error_message(resp):
            raise SGLangHTTPError(self._http.base_url + "/destroy_weights_update_group", resp.status, error_message(resp))

    def _label(self, label: str, *, abort_all: bool) -> None:
        self._call("/update_weight_version", {"new_version": label, "abort_all_requests": abort_all})
        self.server_label = label

    def _call(self, path: str, payload: dict, allow: tuple[int, ...] = ()) -> Response:
        return self._http.call(path, payload, timeout_s=self._config.request_timeout_s, allow=allow)
