"""The feeder: keeps the hub's prompt queue topped up from the run's task.

    task prompt source ──(index i → prompt "task-i")──▶ Feeder thread ──SubmitPrompts──▶ hub

It aims for `target` queued prompts (enough for the generators to lease while the hub's staleness
rule allows): prompts_per_step x (max_staleness + 2). The data cursor (next index) is kept in
RUN_DIR/feeder.json, written after each accepted submit; after a crash a prompt may be offered
twice, and the hub refuses the duplicate id, so no prompt is queued twice. The source is seeded,
so a resumed run continues the same prompt sequence. A hub that dies and is restarted by the launcher
is waited for (launch.hub_reconnect_s), as every other service waits for it.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import threading
from pathlib import Path

from asyncrl import records as R
from asyncrl.models.config import resolve_model_path
from asyncrl.config.run import RunConfig
from asyncrl.net.credentials import Credentials
from asyncrl.net.peer import HubError
from asyncrl.net.sharded_peer import hub_peer
from asyncrl.run.rundir import write_json
from asyncrl.task.source import make_prompt_source

log = logging.getLogger(__name__)


class Feeder:
    def __init__(self, cfg: RunConfig, endpoints: list[str], run_dir: Path, poll_s: float = 0.2,
                 credentials: Credentials | None = None) -> None:
        """`credentials`: the role the feeder proves (the launcher's); None: the environment's."""
        self.cfg, self.endpoints, self.poll_s, self.credentials = cfg, endpoints, poll_s, credentials
        self.cursor_path = Path(run_dir) / "feeder.json"
        self.target = cfg.batch.prompts_per_step * (cfg.hub.max_staleness + 2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="feeder", daemon=True)
        self.error: BaseException | None = None
        self.request_timeout_s = 5.0  # loopback: a live hub answers in ms

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _cursor(self) -> int:
        try:
            return int(json.loads(self.cursor_path.read_text())["next_index"])
        except (OSError, ValueError, KeyError):
            return 0

    def _save_cursor(self, index: int) -> None:
        write_json(self.cursor_path, {"next_index": index})

    def _run(self) -> None:
        try:
            self._feed()
        except BaseException as e:  # noqa: BLE001 - reported by the launcher
            self.error = e
            log.exception("feeder stopped")

    def _feed(self) -> None:
        cfg = self.cfg
        sampling = R.SamplingParams(temperature=cfg.task.temperature, max_new_tokens=cfg.task.max_new_tokens)
        source = make_prompt_source(cfg.task, cfg.batch.samples_per_prompt, sampling,
                                    tokenizer_path=resolve_model_path(cfg.model) if cfg.task.chat_template else None,
                                    heldout=cfg.eval.heldout_count())  # evaluation's prompts are never trained on
        index = self._cursor()
        source = itertools.islice(source, index, None)
        # A hub killed while our request is in flight never answers it: ask again on a new socket for as long
        # as the launcher may take to restart it (a repeated SubmitPrompts is refused as a duplicate, never
        # queued twice).
        peer = hub_peer(self.endpoints, "feeder", timeout_s=self.request_timeout_s, reconnect_s=cfg.launch.hub_reconnect_s,
                       credentials=self.credentials)
        peer.give_up = self._stop.is_set
        try:
            while not self._stop.is_set():
                queued = int(peer.request(R.StatsRequest()).counters.get("queued_prompts", 0))
                want = self.target - queued
                if want <= 0:
                    self._stop.wait(self.poll_s)
                    continue
                prompts = [dataclasses.replace(p, prompt_id=f"task-{index + i}")
                           for i, p in enumerate(itertools.islice(source, want))]
                if not prompts:
                    log.info("prompt source exhausted at index %d", index)
                    return
                try:
                    peer.request(R.SubmitPrompts(prompts=prompts))
                except HubError as e:
                    log.warning("hub refused prompts %d..%d: %s", index, index + len(prompts) - 1, e)
                index += len(prompts)
                self._save_cursor(index)
        finally:
            peer.close()
