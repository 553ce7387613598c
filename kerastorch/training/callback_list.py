"""``CallbackList``: every callback of a run, in order, called hook by hook."""

from __future__ import annotations

import warnings
from typing import Any, Iterable, Iterator, Optional

from .callback import HOOKS, Callback, hooks_of, run_order


class CallbackList:
    """Calls a hook on every callback, sorted by their ``order`` attribute (stable).

    A hook is called only on the callbacks that override it, so an unused hook costs
    nothing, per step or otherwise; :meth:`wants` lets the loop skip even the call.
    """

    def __init__(self, callbacks: Iterable[Callback], model: Any, params: dict):
        self.callbacks: list[Callback] = sorted(callbacks, key=run_order)
        self.params = params  # every callback's ``self.params``: what the run adds later, they all see
        for cb in self.callbacks:
            cb.set_model(model)
            cb.set_params(params)
        implemented = [(cb, hooks_of(cb)) for cb in self.callbacks]
        self._listeners = {hook: [getattr(cb, hook) for cb, hooks in implemented if hook in hooks] for hook in HOOKS}
        self._owners = {hook: [cb for cb, hooks in implemented if hook in hooks] for hook in HOOKS}

    def wants(self, hook: str) -> bool:
        return bool(self._listeners[hook])

    def listeners(self, hook: str) -> list:
        """The callbacks' bound ``hook`` methods, in order: what the loop calls at every batch."""
        return self._listeners[hook]

    def call(self, hook: str, *args: Any) -> None:
        for fn in self._listeners[hook]:
            fn(*args)

    def call_every(self, hook: str, *args: Any) -> list[tuple[Callback, BaseException]]:
        """Call ``hook`` on every callback even when one raises, and return each error with the callback
        that raised it, in order: for ``on_train_end``, where each callback puts back what it took
        (signal handlers, open files, a run's status), whatever another's end went like. The caller
        decides which to raise."""
        raised = []
        for callback, fn in zip(self._owners[hook], self._listeners[hook]):
            try:
                fn(*args)
            except BaseException as error:  # Ctrl-C too: the others still put back what they took
                raised.append((callback, error))
        return raised

    def end(self, logs: dict, stopped_by: Optional[BaseException]) -> None:
        """``on_train_end`` on every callback, whatever the others' ends raise; then the one error the
        caller gets, first of: a Ctrl-C (or an exit) during an end; the error that stopped training (the
        one to fix, and the one an ``except`` around ``fit`` waits for, ``kt.Preempted`` too), which the
        ``finally`` this is called from lets go on; the error a callback raises to tell how the run
        ended (``raises_the_outcome``: Optuna's ``TrialPruned``); the first end's error. Each other end's
        error (a checkpoint's write that failed on its thread) is told in the chosen one's traceback."""
        raised = self.call_every("on_train_end", logs)
        ranked = [
            *(error for _, error in raised if not isinstance(error, Exception)),
            *([stopped_by] if stopped_by is not None else []),
            *(error for callback, error in raised if callback.raises_the_outcome),
            *(error for _, error in raised),
        ]
        if not ranked:
            return
        chosen = ranked[0]
        for callback, error in raised:
            if error is not chosen:
                tell_beside(
                    chosen,
                    f"{type(callback).__name__}.on_train_end raised too, as fit ended: {type(error).__name__}: {error}",
                )
        if chosen is stopped_by:
            return
        try:
            raise chosen
        finally:
            del ranked, raised, chosen, stopped_by  # the raised error's traceback holds this frame: no cycle

    def __iter__(self) -> Iterator[Callback]:
        return iter(self.callbacks)


def tell_beside(error: BaseException, message: str) -> None:
    """``message`` in ``error``'s traceback (a note, Python 3.11 and later), else as a warning."""
    if hasattr(error, "add_note"):
        error.add_note(message)
    else:
        warnings.warn(message, RuntimeWarning, stacklevel=2)


__all__ = ["CallbackList"]
