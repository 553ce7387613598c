"""``CallbackList``: every callback of a run, in order, called hook by hook."""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from .base import HOOKS, Callback, hooks_of, run_order


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

    def __iter__(self) -> Iterator[Callback]:
        return iter(self.callbacks)


__all__ = ["CallbackList"]
