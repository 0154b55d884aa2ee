"""The NCCL environment of a GPU run, one table for every process: the launcher gives it to each GPU child,
and a process that makes NCCL communicators without the launcher sets it as defaults. It must be the same
everywhere (a learner and a generator that disagree on NCCL_CUMEM_ENABLE may fail to connect); NVLink
SHARP / multicast stay off (the GPU hosts require it; SGLang sets the same), as does cuMem (NCCL comms
that live beside other comms are fragile with it).
"""

from __future__ import annotations

import os

NCCL_ENV = {
    "NCCL_CUMEM_ENABLE": "0",
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def nccl_env() -> dict[str, str]:
    """The settings every process of a GPU run gets (a copy)."""
    return dict(NCCL_ENV)


def set_nccl_defaults() -> None:
    """Set in this process each setting its environment does not give (before the first communicator)."""
    for key, value in NCCL_ENV.items():
        os.environ.setdefault(key, value)
