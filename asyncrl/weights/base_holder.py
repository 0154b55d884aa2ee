"""The base holder: the process that owns the shared base image (`generator.share_base`, base_image.py).

    load the model folder's tensors on the CPU -> copy its matrices into one image on the device -> publish the
    manifest -> hold the image, doing nothing else, until the launcher stops it

It is a process of its own so that the learner and the generators, which map the image, can each crash and
restart on their own: none of them owns the memory the others compute with. It starts before them, and the
launcher stops it after them (base_image.py, "Lifetime"); it is not restarted: if it dies, the memory its
consumers read is gone, and the run ends with its log's last lines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import torch

from asyncrl.engine.torch.model import load_hf_folder
from asyncrl.precision import dtypes
from asyncrl.weights import base_image

log = logging.getLogger("asyncrl.weights.base_holder")


def hold(run_dir: str, model_path: str, dtype: str, device: str, stopped: Callable[[], bool],
         poll_s: float = 0.5) -> int:
    """Write the image of `model_path` in `dtype` on `device` and keep it until `stopped()`; -> its bytes."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    t0 = time.perf_counter()
    model = load_hf_folder(model_path, dtypes.torch_dtype(dtype, dev), torch.device("cpu"))  # read once, on the host
    named = base_image.matrices(model.named_parameters())
    image = base_image.write(run_dir, named, dev)
    log.info("base image: %d matrices, %.1f MB on %s in %.1f s", len(named), image.numel() / 1e6, dev,
             time.perf_counter() - t0)
    del model, named
    try:
        while not stopped():
            time.sleep(poll_s)
        return image.numel()  # the image stays referenced, and so allocated, until here
    finally:
        base_image.remove(run_dir)  # the consumers are stopped (the launcher stops this process last)
