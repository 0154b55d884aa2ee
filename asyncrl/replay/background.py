"""`BackgroundHub`: a hub served from a daemon thread (tests, notebooks, embedding).

    hub = BackgroundHub(HubConfig(), BatchConfig(), run_dir=None)   # binds a free loopback port
    hub = BackgroundHub(..., secret=RunSecret.ensure(run_dir))      # peers must authenticate (roles checked)
    hub = BackgroundHub(..., metrics_port=0)  # Prometheus on hub.hub.exporter.url
    client = asyncrl.Client(hub.endpoint)
    hub.stop()
"""

from __future__ import annotations

import threading
from pathlib import Path

from asyncrl.replay.config import BatchConfig, HubConfig
from asyncrl.replay.hub import Hub


class BackgroundHub:
    def __init__(self, cfg: HubConfig, batch: BatchConfig, run_dir: str | Path | None = None,
                 endpoint: str = "tcp://127.0.0.1:0", secret: bytes | None = None,
                 metrics_port: int | None = None, filter_uniform: bool = False) -> None:
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self.hub: Hub | None = None
        args = (cfg, batch, run_dir, endpoint, secret, metrics_port, filter_uniform)
        self.thread = threading.Thread(target=self._run, args=args, daemon=True, name="asyncrl-hub")
        self.thread.start()
        if not self._ready.wait(30):
            raise TimeoutError("hub thread did not start within 30 s")
        if self._error is not None:
            raise self._error
        self.endpoint: str = self.hub.endpoint  # type: ignore[union-attr]

    def _run(self, cfg: HubConfig, batch: BatchConfig, run_dir: str | Path | None, endpoint: str,
             secret: bytes | None, metrics_port: int | None, filter_uniform: bool) -> None:
        try:  # the hub's sockets are made and used on this thread only
            self.hub = Hub(cfg, batch, run_dir, endpoint, secret, metrics_port, filter_uniform)
        except BaseException as e:
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        try:
            self.hub.serve()
        finally:
            self.hub.close()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.hub is not None and self.thread.is_alive():
            self.hub.stop()
            self.thread.join(timeout_s)
            if self.thread.is_alive():
                raise TimeoutError("hub thread did not stop")
