"""A callback made of plain functions, for one-off behaviour without a class."""

from __future__ import annotations

from typing import Callable, Optional

from ..training.callback import HOOKS, Callback


class LambdaCallback(Callback):
    """Give any hook as a function with that hook's arguments:
    ``on_epoch_end(epoch, logs)``, ``on_train_batch_end(batch, logs)``, ``on_train_begin(logs)`` ...

    Only the hooks given are called; a per-step hook that is not given costs nothing.
    Reading per-step ``logs`` costs one device sync for that step, so read them only
    when you need them.

    Example::

        from kerastorch.callbacks import LambdaCallback

        show = LambdaCallback(on_epoch_end=lambda epoch, logs: print(epoch, logs["val_loss"]))
        model.fit(dl_train, dl_val, epochs=3, callbacks=[show])
    """

    calls_your_functions = True

    def __init__(
        self,
        on_epoch_begin: Optional[Callable] = None,
        on_epoch_end: Optional[Callable] = None,
        on_train_begin: Optional[Callable] = None,
        on_train_end: Optional[Callable] = None,
        on_train_batch_begin: Optional[Callable] = None,
        on_train_batch_end: Optional[Callable] = None,
        **other_hooks: Callable,
    ):
        hooks = {
            "on_epoch_begin": on_epoch_begin,
            "on_epoch_end": on_epoch_end,
            "on_train_begin": on_train_begin,
            "on_train_end": on_train_end,
            "on_train_batch_begin": on_train_batch_begin,
            "on_train_batch_end": on_train_batch_end,
            **other_hooks,
        }
        for name, fn in hooks.items():
            if name not in HOOKS:
                raise TypeError(f"LambdaCallback got {name}=..., which is not a hook; hooks are: {', '.join(HOOKS)}.")
            if fn is None:
                continue
            if not callable(fn):
                raise TypeError(f"LambdaCallback {name} must be a function; got a {type(fn).__name__}.")
            setattr(self, name, fn)  # an instance attribute: the callback list sees it as overridden


__all__ = ["LambdaCallback"]
