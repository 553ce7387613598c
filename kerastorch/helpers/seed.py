"""One call that makes a CPU run repeat exactly."""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def seed_everything(seed: int = 42, deterministic: bool = True) -> int:
    """Seed python, numpy, torch and CUDA, and set the flags that make runs repeat.

    With ``deterministic=True`` cuDNN picks deterministic kernels and torch warns about
    operations that have none. DataLoader shuffling follows torch's seed; pass
    ``worker_init_fn=kerastorch.seed_worker`` to loaders with ``num_workers > 0`` so that
    numpy and ``random`` inside workers repeat too. Returns the seed.
    """
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed={seed!r} must be an int.")
    os.environ["PYTHONHASHSEED"] = str(seed)  # for subprocesses this run starts
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)
    if deterministic:
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
        torch.use_deterministic_algorithms(True, warn_only=True)
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    return seed


def seed_worker(worker_id: int) -> None:
    """``DataLoader(worker_init_fn=seed_worker)``: numpy and random in each worker follow torch's seed."""
    worker_seed = torch.initial_seed() % 2**32
    np.random.seed(worker_seed)
    random.seed(worker_seed)
