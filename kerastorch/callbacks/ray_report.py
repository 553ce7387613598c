"""Inside a Ray Train worker: report every epoch to Ray, and continue from Ray's checkpoint.

``fit`` adds a :class:`RayTrainReport` by itself when it runs in a worker of Ray Train's
``TorchTrainer`` (:func:`~kerastorch.cluster_environment` names it ``"ray"``). At the end of
every epoch, after the training state is written, each worker calls ``ray.train.report``
with the epoch's row of the history, so ``result.metrics`` holds the last epoch. The main
worker (rank 0) attaches a ``ray.train.Checkpoint`` to every report: the best weights so far,
and with ``fit(resume=True, ckpt_path=...)`` the training state. Ray Train keeps
``result.metrics`` only from reports that carry a checkpoint, and ``ray.train.report`` waits for
every worker, so every worker reports once per epoch.

A worker group that ``FailureConfig(max_failures=...)`` restarted finds the last checkpoint with
``ray.train.get_checkpoint()``: :func:`ray_train_report` puts its files back at ``ckpt_path``
(on the main worker, before the training state is read), so ``fit(resume=True)`` continues
after the last reported epoch and ends with the history of an uninterrupted run.

Ray is imported only here, only when a worker runs fit: ``import kerastorch`` never imports it.

Example (what ``examples/ray_train.py`` runs)::

    def train_loop_per_worker(config):
        model = kt.KerasModel(net, loss_fn, metrics_dict, optimizer)
        model.fit(dl_train, dl_val, epochs=5, ckpt_path="/tmp/run/best.safetensors", resume=True)

    trainer = TorchTrainer(train_loop_per_worker, scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(failure_config=FailureConfig(max_failures=1)))
    result = trainer.fit()   # result.metrics: the last epoch's row; result.checkpoint: its files
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Optional, Sequence

from ..files.atomic import atomic_path
from ..files.weights import save_weights
from ..training.callback import ORDER_RAY_REPORT, Callback

BEST_WEIGHTS_NAME = "best.safetensors"  # the best weights' name in a checkpoint when fit has no ckpt_path


class RayTrainReport(Callback):
    """Report each epoch's logs to Ray Train, with the main worker's best weights and kept files.

    ``weights_name`` is the best weights' file name in the checkpoint (``ckpt_path``'s own name);
    ``kept_files`` are the files fit keeps beside them (the training state), attached as they are.
    """

    order = ORDER_RAY_REPORT

    def __init__(self, weights_name: str = BEST_WEIGHTS_NAME, kept_files: Sequence[str] = ()):
        self.weights_name = weights_name
        self.kept_files = list(kept_files)

    def on_epoch_end(self, epoch, logs=None):
        import ray.train

        metrics = {name: _plain(value) for name, value in (logs or {}).items()}
        with tempfile.TemporaryDirectory(prefix="kerastorch-ray-checkpoint-") as folder:
            checkpoint = None
            if self.model.is_main_process:
                self.write_checkpoint(folder)
                checkpoint = ray.train.Checkpoint.from_directory(folder)
            # A barrier over the workers; it copies the folder to the run's storage before returning.
            ray.train.report(metrics, checkpoint=checkpoint)

    def write_checkpoint(self, folder: str) -> None:
        """The best weights so far (fit's own choice of best epoch) and the kept files, into ``folder``."""
        best_weights = getattr(self.params.get("best"), "best_weights", None)
        if best_weights is not None:
            save_weights(best_weights, os.path.join(folder, self.weights_name))
        for path in self.kept_files:
            if os.path.isfile(path):
                shutil.copyfile(path, os.path.join(folder, os.path.basename(path)))


def ray_train_report(
    ckpt_path: Optional[str | os.PathLike], kept_files: Sequence[str], is_main_process: bool
) -> RayTrainReport:
    """fit's :class:`RayTrainReport`, after putting back, on the main worker, the files of the checkpoint
    Ray restarted this worker group from (before the training state reads them at ``on_train_begin``).

    Files come back only when fit keeps some (``resume=True``): without them a restarted run starts afresh.
    """
    ckpt_path = os.fspath(ckpt_path) if ckpt_path else None
    if kept_files and is_main_process:
        restore_from_ray_checkpoint([path for path in (ckpt_path, *kept_files) if path])
    weights_name = os.path.basename(ckpt_path) if ckpt_path else BEST_WEIGHTS_NAME
    return RayTrainReport(weights_name, kept_files)


def restore_from_ray_checkpoint(paths: Sequence[str]) -> None:
    """Copy the files of Ray's last checkpoint that have the names of ``paths`` to those paths, atomically
    (a kill leaves the old file or the new one). Nothing happens in a run Ray started afresh."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return
    with checkpoint.as_directory() as folder:
        for path in paths:
            source = os.path.join(folder, os.path.basename(path))
            if os.path.isfile(source):
                with atomic_path(path) as tmp:
                    shutil.copyfile(source, tmp)


def _plain(value):
    """A number Ray can keep: ints stay ints (the epoch), tensors and numpy numbers become floats."""
    if isinstance(value, (bool, int)):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


__all__ = ["RayTrainReport", "ray_train_report"]
