"""Any Python function as a reward: options.function = "pkg.module:fn", called as fn(response, spec).

fn may be sync or async and returns a number or a dict of numbers (see `RewardValue`). Async functions
run on the worker's event loop; sync ones in a thread, or in the process pool with options.cpu_heavy
(the child process imports the function itself; nothing but its arguments and result is pickled).
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
from collections.abc import Callable
from typing import Any

from asyncrl.records import RewardSpec
from asyncrl.reward.offload import Offload
from asyncrl.reward.protocol import RewardValue

_resolved: dict[str, Callable[..., Any]] = {}  # per process: the pool's children import once


def resolve(path: str) -> Callable[..., Any]:
    if path not in _resolved:
        module_name, sep, attr = path.partition(":")
        if not sep or not module_name or not attr:
            raise ValueError(f'python reward options.function={path!r}: expected "pkg.module:function"')
        try:
            obj: Any = importlib.import_module(module_name)
            for part in attr.split("."):
                obj = getattr(obj, part)
        except (ImportError, AttributeError) as e:
            raise ValueError(f"python reward options.function={path!r} cannot be imported: {e}") from None
        if not callable(obj):
            raise ValueError(f"python reward options.function={path!r} is not callable")
        _resolved[path] = obj
    return _resolved[path]


def call_in_process(path: str, response: str, spec: RewardSpec) -> Any:
    """Entry point inside a pool process."""
    value = resolve(path)(response, spec)
    return asyncio.run(value) if inspect.isawaitable(value) else value


class PythonFunction:
    def __init__(self, options: dict[str, Any], offload: Offload) -> None:
        unknown = set(options) - {"function", "cpu_heavy"}
        if unknown:
            raise ValueError(f"python reward options: unknown {sorted(unknown)}; allowed: function, cpu_heavy")
        self.path = str(options["function"])
        self.fn = resolve(self.path)  # fail at start-up, not on the first sample
        self.cpu_heavy = bool(options.get("cpu_heavy", False))
        self.is_async = inspect.iscoroutinefunction(self.fn)
        self.offload = offload

    async def __call__(self, response: str, spec: RewardSpec) -> RewardValue:
        if self.cpu_heavy:
            return await self.offload.run(call_in_process, self.path, response, spec, heavy=True)
        if self.is_async:
            return await self.fn(response, spec)
        return await self.offload.run(self.fn, response, spec, heavy=False)

    async def close(self) -> None:
        pass
