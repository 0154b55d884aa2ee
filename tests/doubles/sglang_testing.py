"""Small helpers for tests that drive an engine against the SGLang test double."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

from asyncrl.engine.protocol import Engine, GenerationOutput


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.005)


def collect(engine: Engine, timeout_s: float = 10.0) -> list[GenerationOutput]:
    """step() until the engine has no work left; sorted by (request_id, sample_index)."""
    outputs: list[GenerationOutput] = []
    deadline = time.monotonic() + timeout_s
    while engine.has_work():
        if time.monotonic() > deadline:
            raise TimeoutError(f"engine still busy after {timeout_s} s")
        outputs += engine.step()
    return sorted(outputs, key=lambda o: (o.request_id, o.sample_index))
