"""stage(name): a named range in torch.profiler traces (`bench.trace_gaps` blames the GPU's idle gaps on them).

`torch.profiler.record_function` costs a dispatcher call on entry and exit even with no profiler running
(~15 us a range on a 2-core VM), too much for a decode step's host loop. `stage` returns a shared no-op
context unless a profiler is active, which it asks of a flag that torch.autograd.profiler keeps (private; when
a torch version lacks it, every stage is a real range)."""

from __future__ import annotations

import contextlib

import torch.autograd.profiler as _profiler
from torch.profiler import record_function

_NOOP = contextlib.nullcontext()


def stage(name: str) -> contextlib.AbstractContextManager:
    return record_function(name) if getattr(_profiler, "_is_profiler_enabled", True) else _NOOP
