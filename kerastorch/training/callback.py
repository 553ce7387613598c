"""The ``Callback`` base: Keras's hook names, called by the loop at the same moments."""

from __future__ import annotations

import weakref
from typing import Any, Optional


class Callback:
    """Base class for everything optional in ``fit``: subclass it and override any hook.

    ``self.model`` is the :class:`~kerastorch.KerasModel` being trained and
    ``self.params`` holds ``epochs``, ``steps`` (training batches per epoch, or None),
    ``verbose``, fit's ``monitor``, ``mode`` and ``ckpt_path``, ``metrics`` (the
    history's columns after ``epoch``, known before the first batch) and ``train_data``
    (this process's training batches, for a callback that needs a pass over them); when
    ``on_train_end`` runs, ``ended`` says how fit ended: ``"finished"`` (every epoch, or a
    stop asked for), ``"interrupted"`` (Ctrl-C), ``"preempted"`` (SIGTERM: ``kt.Preempted`` goes by)
    or ``"failed"`` (an error goes by). ``epoch`` is
    1-based, like the history's ``epoch`` column. Set ``self.model.stop_training = True``
    to stop after the current epoch (from a training batch hook: after that batch).

    Per-step ``logs`` are read from the device only if you look at them, so a
    callback that reads ``logs["train_loss"]`` every step pays a host sync every step.

    ``evaluate(callbacks=[...])`` calls the test hooks (``on_test_begin``, ``on_test_batch_begin/end``,
    ``on_test_end(logs)``), as fit's validation does; ``predict(callbacks=[...])`` the predict hooks
    (``on_predict_begin``, ``on_predict_batch_begin(batch)``, ``on_predict_batch_end(batch,
    {"outputs": ...})`` with the batch's outputs as the net returned them, ``on_predict_end``), as Keras
    calls them.

    Inside the training step, as in Lightning and fastai: ``on_before_backward(loss)``,
    ``on_after_backward()`` (gradients are there), ``on_before_optimizer_step(optimizer)``
    (gradients unscaled under 16-mixed, not yet clipped) and ``on_after_optimizer_step(optimizer)``
    (weights updated). The loop calls a hook only if some callback overrides it, so an
    unused hook costs nothing per step.

    Callbacks run in the order of their ``order`` attribute (lower first; ties keep the
    order they were given in): fit's own watchers (NaN, best weights, early stopping)
    come before yours (``order = 0``), the training state after them and the progress
    bar last.

    With a callback of yours in the run, ``fit`` writes each better epoch's file at ``ckpt_path``
    (and each file of a :class:`~kerastorch.callbacks.ModelCheckpoint`) before calling it, so it may
    read the file at the epoch's end; the training state (``resume=True``, ``BackupAndRestore``) is
    then written before the next callback after it. One that never reads them can say so with
    ``reads_ckpt_path = False``: with only such callbacks of yours, the files are written on a
    thread of their own while the next epoch trains, as in a run with none.

    A callback that writes a value of its own into the epoch's ``logs`` (a score it computes,
    Keras's way) names it in ``adds_logs``: the value is then a column of the run, which ``fit``'s
    ``monitor``, ``EarlyStopping``, ``ModelCheckpoint`` and ``ReduceLROnPlateau`` may watch, and the
    callback runs before them (at ``order`` -22 at the latest), so they see it at the same epoch.

    Example::

        class StopAtEpoch(kt.Callback):
            def on_epoch_end(self, epoch, logs=None):
                if epoch == 2:
                    self.model.stop_training = True

        model.fit(dl_train, dl_val, callbacks=[StopAtEpoch()])
    """

    model: Any = None
    params: dict = {}
    order: int = 0
    # Names this callback writes into each epoch's logs in on_epoch_end (see above).
    adds_logs: tuple[str, ...] = ()
    reads_ckpt_path: bool = True  # see above; heeded for callbacks that run code of the user's
    # True for a callback whose on_train_end raises on purpose to tell the caller how the run ended (a
    # pruned trial): when training itself raised nothing, that error is the one fit raises, whatever
    # other callbacks' ends raised (they are told in its traceback).
    raises_the_outcome: bool = False
    # True for those of kerastorch's callbacks that call functions given to them (LambdaCallback, the
    # wrapper of a callback written for another library): they run the user's code, as their classes do.
    calls_your_functions: bool = False

    def set_model(self, model: Any) -> None:
        self.model = model

    def set_params(self, params: dict) -> None:
        self.params = params

    def on_train_begin(self, logs: Optional[dict] = None) -> None: ...
    def on_train_end(self, logs: Optional[dict] = None) -> None: ...
    def on_epoch_begin(self, epoch: int, logs: Optional[dict] = None) -> None: ...
    def on_epoch_end(self, epoch: int, logs: Optional[dict] = None) -> None: ...
    def on_train_batch_begin(self, batch: int, logs: Optional[dict] = None) -> None: ...
    def on_train_batch_end(self, batch: int, logs: Optional[dict] = None) -> None: ...
    def on_test_begin(self, logs: Optional[dict] = None) -> None: ...
    def on_test_end(self, logs: Optional[dict] = None) -> None: ...
    def on_test_batch_begin(self, batch: int, logs: Optional[dict] = None) -> None: ...
    def on_test_batch_end(self, batch: int, logs: Optional[dict] = None) -> None: ...
    def on_predict_begin(self, logs: Optional[dict] = None) -> None: ...
    def on_predict_end(self, logs: Optional[dict] = None) -> None: ...
    def on_predict_batch_begin(self, batch: int, logs: Optional[dict] = None) -> None: ...
    def on_predict_batch_end(self, batch: int, logs: Optional[dict] = None) -> None: ...
    def on_before_backward(self, loss: Any) -> None: ...
    def on_after_backward(self) -> None: ...
    def on_before_optimizer_step(self, optimizer: Any) -> None: ...
    def on_after_optimizer_step(self, optimizer: Any) -> None: ...

    def state_dict(self) -> dict:
        """What this callback must remember across a resumed run (plain values and tensors)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Take back what :meth:`state_dict` returned."""


def may_read_ckpt_path(callback: Callback) -> bool:
    """Whether ``callback`` may read the best-weights file (or a ModelCheckpoint's, or the training
    state) while training goes on, so that fit must write it before calling it (see
    :class:`~kerastorch.callbacks.kept_weights.KeptWeights`): one that runs code of the user's (a
    class of theirs, a subclass of one of kerastorch's too, or one of kerastorch's that calls
    functions they gave it), unless it says it never reads the file (``reads_ckpt_path``).
    kerastorch's own callbacks read it only once ``fit`` has waited for it (``on_train_end``)."""
    runs_your_code = callback.calls_your_functions or not type(callback).__module__.startswith("kerastorch.")
    return runs_your_code and callback.reads_ckpt_path


HOOKS = [name for name in vars(Callback) if name.startswith("on_")]
HOOK_NAMES = frozenset(HOOKS)
PER_STEP_HOOKS = (
    "on_train_batch_begin",
    "on_train_batch_end",
    "on_test_batch_begin",
    "on_test_batch_end",
    "on_predict_batch_begin",
    "on_predict_batch_end",
    "on_before_backward",
    "on_after_backward",
    "on_before_optimizer_step",
    "on_after_optimizer_step",
)

# Where fit's own callbacks stand among the user's (order 0).
ORDER_WATCH_NAN = -30
ORDER_AVERAGED_WEIGHTS = -25  # EMA / SWA swap their weights in before the best weights are taken
ORDER_ADDS_LOGS = -22  # a callback that adds values to the logs, at the latest: the watchers below see them
ORDER_BEST_WEIGHTS = -20
ORDER_EARLY_STOPPING = -10
ORDER_DISPLAY = -5  # the live plot and experiment loggers fit adds from plot= and wandb=
ORDER_TRAINING_STATE = 90  # after every callback whose state it keeps
ORDER_RAY_REPORT = 95  # inside Ray Train: reports the epoch once its training state is written
ORDER_PROGRESS = 100  # drawn last, once every other callback has spoken
ORDER_PRUNING = 110  # a pruned trial raises only after every other callback has finished


# A callback class -> the hooks it implements: read once per class, not once per run and hook (a
# fit call builds its callback list anew). Weak, so a class made inside a function can go.
_CLASS_HOOKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def hooks_of(cb: Any) -> frozenset[str]:
    """The hooks ``cb`` implements itself: its class's, and those set on the instance (LambdaCallback's;
    one set to None there is not implemented, whatever the class says)."""
    cls = type(cb)
    hooks = _CLASS_HOOKS.get(cls)
    if hooks is None:
        hooks = _CLASS_HOOKS[cls] = frozenset(hook for hook in HOOKS if _implements(getattr(cls, hook, None), hook))
    set_here = (vars(cb).keys() if hasattr(cb, "__dict__") else set()) & HOOK_NAMES
    if set_here:
        hooks = (hooks - set_here) | {hook for hook in set_here if _implements(vars(cb)[hook], hook)}
    return hooks


def _implements(impl: Any, hook: str) -> bool:
    return impl is not None and getattr(impl, "__func__", impl) is not getattr(Callback, hook)


def run_order(cb: Any) -> int:
    """Where ``cb`` runs among a run's callbacks: its ``order``, and no later than the watchers of a
    value it adds to the logs."""
    order = getattr(cb, "order", 0)
    return min(order, ORDER_ADDS_LOGS) if getattr(cb, "adds_logs", ()) else order


def logs_added_by(callbacks: Any) -> list[str]:
    """The names ``callbacks`` say they add to each epoch's logs (``adds_logs``), in their order."""
    names: list[str] = []
    for cb in callbacks or ():
        added = getattr(cb, "adds_logs", ())
        if isinstance(added, str) or not all(isinstance(name, str) and name for name in added):
            raise TypeError(
                f"{type(cb).__name__}.adds_logs={added!r} must be a tuple of the names it writes into the logs, "
                "e.g. adds_logs = ('val_auc',)."
            )
        names.extend(name for name in added if name not in names)
    return names
