"""What fit's two keepers of the net's weights share: :class:`~kerastorch.callbacks.RestoreBestWeights`
(the best epoch's) and :class:`~kerastorch.callbacks.last_weights.KeepLastWeights` (the last finite
epoch's, for ``monitor=None``).

Both hold the weights from before training, which come back when no epoch's weights could be kept: a
NaN or infinite loss in the first epoch, or a stop (Ctrl-C) before the first epoch ended. Both keep
their copy in host memory and write it to ``ckpt_path``, atomically.

A run holds one copy of the net in host memory, however many epochs it keeps: each kept epoch's
weights are written over the copy they replace (the weights from before training, for the first).

The file is written from that copy on a thread of its own (:mod:`~kerastorch.files.background`), so
training goes on while the disk takes it. It is whole again before anything relies on it: before the
next kept epoch writes over the copy, before a training state that holds the kept weights is written
(:meth:`KeptWeights.wait_written`), and before ``fit`` returns. A run with callbacks that run the
user's code (:func:`~kerastorch.training.callback.may_read_ckpt_path`) writes the file before they are
called instead (``write_while_training=False``): one of them may read it at the epoch's end, as it
could when every write stopped training.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

from ..files.atomic import remove_stale_temporary_files
from ..files.background import BackgroundWriter
from ..files.weights import save_weights
from ..strategies import strategy_of


class KeptWeights:
    """The weights from before training, and the copy kept since, with the file they go to."""

    def __init__(
        self,
        ckpt_path: Optional[Union[str, os.PathLike]] = None,
        stale_state: Optional[str] = None,
        write_while_training: bool = True,
    ):
        self.ckpt_path = ckpt_path
        self.stale_state = stale_state  # an old run's training state, removed when this run first writes ckpt_path
        self.write_while_training = write_while_training  # False: a keep returns once the file is written
        self.initial: Optional[dict] = None
        self.weights: Optional[dict] = None  # the last epoch's weights kept (None: none yet)
        self._writer = BackgroundWriter("kerastorch-kept-weights")  # writes the file from ``weights``

    def begin(self, model: Any) -> None:
        """Hold the weights from before training: the fallback until an epoch's are kept. A temporary
        file that a run killed while writing ``ckpt_path`` left beside it goes, whatever ``resume`` says."""
        if self.ckpt_path and model.is_main_process:
            remove_stale_temporary_files(self.ckpt_path)
        self.initial, self.weights = strategy_of(model).whole_weights(model.net), None

    def keep(self, model: Any) -> None:
        """Keep a copy of the net's weights in host memory (``weights``), written to ``ckpt_path`` (by
        the main process).

        It is written over the previous copy (the weights from before training, for the first), which
        is let go of first: stopped halfway (Ctrl-C), no copy is kept, and the net holds the weights
        that were being kept. The epoch they belong to has ended, so the weights from before training
        are no fallback any more.

        The file is written on a thread while training goes on, or before this returns (see the module's note)."""
        self.wait_written()  # the write under way reads the copy about to be written over
        previous = self.weights if self.weights is not None else self.initial
        self.weights = self.initial = None
        self.weights = strategy_of(model).whole_weights(model.net, into=previous)
        if self.ckpt_path and model.is_main_process:
            weights, path, stale_state = self.weights, self.ckpt_path, self.stale_state
            self.stale_state = None
            self._writer.start(lambda: _write(weights, path, stale_state))
            if not self.write_while_training:
                self.wait_written()

    def write_if_missing(self, model: Any) -> bool:
        """Write the weights kept to ``ckpt_path`` when the file is not there (a resumed run's best
        weights, whose file was deleted or left behind in another folder); True when it does."""
        if not (self.ckpt_path and self.weights is not None and model.is_main_process):
            return False
        if os.path.exists(self.ckpt_path):
            return False
        weights, path = self.weights, self.ckpt_path
        self._writer.start(lambda: _write(weights, path, None))
        if not self.write_while_training:
            self.wait_written()
        return True

    def wait_written(self) -> None:
        """Return once ``ckpt_path`` holds the weights kept last; raise if writing them failed."""
        self._writer.wait()

    def put_back(self, model: Any, weights: dict) -> None:
        strategy_of(model).load_whole_weights(model.net, weights)

    def end(self, model: Any, logs: Optional[dict], params: dict, broke: bool) -> None:
        """When training ends with no epoch's weights kept: after a NaN (``broke``), or stopped (Ctrl-C)
        before any epoch ended (no ``logs``), the weights from before training come back, never
        half-trained or NaN ones. They are let go either way."""
        initial, self.initial = self.initial, None
        no_epoch_ended = not logs and bool(params.get("epochs"))
        if self.weights is None and initial is not None and (broke or no_epoch_ended):
            self.put_back(model, initial)
            if broke and params.get("verbose"):
                model.print("No epoch had a finite loss, so the weights from before training are restored.")
        self._writer.close()  # fit returns with the file whole


def _write(weights: dict, path: Union[str, os.PathLike], stale_state: Optional[str]) -> None:
    save_weights(weights, path)
    if stale_state and os.path.isfile(stale_state):
        # resume=False: the old run's state belongs to the weights just replaced; it would resume wrongly.
        os.remove(stale_state)


__all__ = ["KeptWeights"]
