"""The ``Callback`` base: Keras's hook names, called by the loop at the same moments."""

from __future__ import annotations

from typing import Any, Iterable, Optional


class Callback:
    """Base class for everything optional in ``fit``: subclass it and override any hook.

    ``self.model`` is the :class:`~kerastorch.KerasModel` being trained and
    ``self.params`` holds ``epochs``, ``steps`` (training batches per epoch, or None),
    ``verbose``, fit's ``monitor``, ``mode`` and ``ckpt_path``, and ``metrics`` (the
    history's columns after ``epoch``, known before the first batch). ``epoch`` is
    1-based, like the history's ``epoch`` column. Set ``self.model.stop_training = True``
    to stop after the current epoch (from a training batch hook: after that batch).

    Per-step ``logs`` are read from the device only if you look at them, so a
    callback that reads ``logs["train_loss"]`` every step pays a host sync every step.

    Example::

        class StopAtEpoch(kt.Callback):
            def on_epoch_end(self, epoch, logs=None):
                if epoch == 2:
                    self.model.stop_training = True

        model.fit(dl_train, dl_val, callbacks=[StopAtEpoch()])
    """

    model: Any = None
    params: dict = {}

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

    def state_dict(self) -> dict:
        """What this callback must remember across a resumed run (plain values and tensors)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Take back what :meth:`state_dict` returned."""


HOOKS = [name for name in vars(Callback) if name.startswith("on_")]
PER_STEP_HOOKS = ("on_train_batch_begin", "on_train_batch_end", "on_test_batch_begin", "on_test_batch_end")


class CallbackList:
    """Calls a hook on every callback, in order. Per-step hooks are called only on the
    callbacks that override them, so an unused hook costs nothing per step."""

    def __init__(self, callbacks: Iterable[Any], model: Any, params: dict):
        from .adapters import as_callback

        self.callbacks = [as_callback(cb) for cb in callbacks]
        for cb in self.callbacks:
            cb.set_model(model)
            cb.set_params(params)
        self._listeners = {hook: [getattr(cb, hook) for cb in self.callbacks if _overrides(cb, hook)] for hook in HOOKS}

    def wants(self, hook: str) -> bool:
        return bool(self._listeners[hook])

    def call(self, hook: str, *args: Any) -> None:
        for fn in self._listeners[hook]:
            fn(*args)

    def __iter__(self):
        return iter(self.callbacks)


def _overrides(cb: Any, hook: str) -> bool:
    # Looked up on the instance, so hooks set as attributes (LambdaCallback) count too.
    impl = getattr(cb, hook, None)
    return impl is not None and getattr(impl, "__func__", impl) is not getattr(Callback, hook)
