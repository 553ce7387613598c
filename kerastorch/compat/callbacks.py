"""Callbacks written for other libraries, made to work as kerastorch callbacks."""

from __future__ import annotations

from typing import Any

from ..training.callback import HOOKS, Callback

# The hooks torchkeras's KerasModel calls, each with the model as its only argument.
TORCHKERAS_HOOKS = ("on_fit_start", "on_train_epoch_end", "on_validation_epoch_end", "on_fit_end")


def as_callback(obj: Any) -> Callback:
    """A :class:`Callback` as it is; a torchkeras-style callback wrapped in
    :class:`TorchkerasCallback`; anything else refused with a message saying what a callback is."""
    if isinstance(obj, Callback):
        return obj
    if isinstance(obj, type):
        raise TypeError(
            f"callbacks holds the class {obj.__name__}, not an instance of it. Pass callbacks=[{obj.__name__}(...)]."
        )
    if any(callable(getattr(obj, hook, None)) for hook in TORCHKERAS_HOOKS):
        return TorchkerasCallback(obj)
    raise TypeError(
        f"callbacks holds a {type(obj).__name__}, which is not a kerastorch Callback. Subclass "
        f"kerastorch.Callback and override any of: {', '.join(HOOKS)} (or, as in torchkeras, give it any of "
        f"{', '.join(TORCHKERAS_HOOKS)}, each taking the model)."
    )


class TorchkerasCallback(Callback):
    """Runs a torchkeras-style callback: an object with any of ``on_fit_start(model)``,
    ``on_train_epoch_end(model)``, ``on_validation_epoch_end(model)`` and ``on_fit_end(model)``.

    ``fit`` wraps such objects itself, so a torchkeras user passes them unchanged. As in
    torchkeras, the hooks run on the main process only, and the ``model`` they receive
    shows ``history`` as a dict of lists (``model.history["val_loss"][-1]``), plus
    ``accelerator``, ``epochs``, ``monitor``, ``mode`` and ``ckpt_path``; every other
    attribute is the :class:`~kerastorch.KerasModel`'s own. Both epoch hooks run at the
    end of the epoch, once that epoch's train and val values are in ``history``.

    Example::

        class PrintBest:                         # written for torchkeras
            def on_validation_epoch_end(self, model):
                print(min(model.history["val_loss"]))

        model.fit(dl_train, dl_val, epochs=3, callbacks=[PrintBest()])
    """

    calls_your_functions = True

    def __init__(self, callback: Any):
        self.callback = callback
        self.history: dict[str, list] = {}

    def _call(self, hook: str) -> None:
        fn = getattr(self.callback, hook, None)
        if callable(fn) and self.model.is_main_process:
            fn(model=TorchkerasModelView(self.model, self.history, self.params))

    def on_train_begin(self, logs=None):
        self.history = {}
        self._call("on_fit_start")

    def on_epoch_end(self, epoch, logs=None):
        for name, value in logs.items():
            self.history.setdefault(name, []).append(value)
        self._call("on_train_epoch_end")
        self._call("on_validation_epoch_end")

    def on_train_end(self, logs=None):
        self._call("on_fit_end")


class TorchkerasModelView:
    """The model as a torchkeras callback expects to see it; writes go to the real model."""

    def __init__(self, model: Any, history: dict, params: dict):
        runtime = getattr(model, "runtime", None)
        extra = {
            "history": history,
            "accelerator": getattr(runtime, "accelerator", None),
            "epochs": params.get("epochs"),
            "monitor": params.get("monitor"),
            "mode": params.get("mode"),
            "ckpt_path": params.get("ckpt_path"),
        }
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_extra", extra)

    def __getattr__(self, name: str) -> Any:
        extra = object.__getattribute__(self, "_extra")
        if name in extra:
            return extra[name]
        return getattr(object.__getattribute__(self, "_model"), name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Python looks up model(x) on the type, past __getattr__; torchkeras's KerasModel is an
        # nn.Module, so callbacks call it (VisDisplay's display_fn: model(image.unsqueeze(0))).
        return object.__getattribute__(self, "_model")(*args, **kwargs)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_model"), name, value)
