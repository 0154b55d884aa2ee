"""asyncrl: asynchronous, disaggregated RL post-training for LLMs. `asyncrl.Client` is imported lazily."""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from asyncrl.client import AsyncClient, Client

__all__ = ["AsyncClient", "Client"]


def __getattr__(name: str) -> Any:
    if name in ("Client", "AsyncClient"):
        from asyncrl import client

        return getattr(client, name)
    raise AttributeError(f"module 'asyncrl' has no attribute {name!r}")
