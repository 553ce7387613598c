"""``fit(compile=True)``: the net runs through ``torch.compile`` for one run, then is the user's again.

The compiled wrapper (``OptimizedModule``) holds the user's module as ``_orig_mod`` and
shares its parameters, so the optimizer, the best weights and the training state see the
same tensors; :func:`kerastorch.files.weights.unwrap` strips the wrapper before any state dict
is taken, which keeps the module's own keys (no ``_orig_mod.`` prefix) in every file.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator, Optional

import torch


@contextlib.contextmanager
def compiled_net(model, compile_options: Optional[dict]) -> Iterator[None]:
    """Run the body with ``model.net`` compiled by ``torch.compile(**compile_options)``.

    ``None`` leaves the net alone. ``{"strict": True}`` raises when compiling fails; otherwise a
    failure warns once and the run goes on eagerly. ``model.net`` is the user's object again
    afterwards, also when the user had compiled it already.

    >>> import torch
    >>> from types import SimpleNamespace
    >>> net = torch.nn.Linear(2, 1)
    >>> holder = SimpleNamespace(net=net)
    >>> with compiled_net(holder, {}):
    ...     type(holder.net).__name__
    'OptimizedModule'
    >>> holder.net is net
    True
    """
    if compile_options is None:
        yield
        return
    options = dict(compile_options)
    strict = options.pop("strict", False)
    users_net = model.net
    # A net compiled by the user is compiled again from its module, with fit's options.
    compiled_before = isinstance(getattr(users_net, "_orig_mod", None), torch.nn.Module)  # torch.compile's wrapper
    bare = users_net._orig_mod if compiled_before else users_net
    try:
        model.net = torch.compile(bare, **options)
    except Exception as error:  # a bad option, or no compiler backend on this machine
        if strict:
            raise RuntimeError(
                f"torch.compile failed ({type(error).__name__}: {error}); fix the compile options "
                "or pass compile=True to fall back to eager with a warning."
            ) from error
        warnings.warn(
            f"compile: torch.compile failed ({type(error).__name__}: {error}); training runs eagerly.", stacklevel=2
        )
    try:
        yield
    finally:
        model.net = users_net


@contextlib.contextmanager
def eager_net(model) -> Iterator[None]:
    """Run the body with ``model.net`` as the module the compiled wrapper holds, if it is one: a
    check's forward pass, with hooks on every module, gains nothing from being compiled."""
    net = model.net
    bare = getattr(net, "_orig_mod", None)
    if not isinstance(bare, torch.nn.Module):
        yield
        return
    model.net = bare
    try:
        yield
    finally:
        model.net = net


__all__ = ["compiled_net", "eager_net"]
