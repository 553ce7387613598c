"""What torchkeras programs use of ``KerasModel`` being an ``nn.Module`` and of its class attributes.

torchkeras's ``KerasModel`` is a ``torch.nn.Module`` wrapping the net: its programs call
``model(x)``, ``model.parameters()``, ``model.state_dict()``, ``model.eval()``, read
``model.accelerator`` inside callbacks, call ``model.fit_ddp(...)``, and replace the step with
``KerasModel.StepRunner = MyStepRunner``. :class:`ModuleLike` gives kerastorch's
``KerasModel`` those names, each passing through to the net (kerastorch's model is not a module
itself: it holds one).
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

import pandas as pd
import torch

from ..strategies import unwrap
from .accelerator import LocalAccelerator


class ModuleLike:
    """The ``nn.Module`` names of torchkeras's ``KerasModel``, passed through to ``self.net``."""

    net: torch.nn.Module
    runtime: Any
    fit_step: Any

    # torchkeras's step classes: None runs fit's own step; a program may set its own (compat.runners).
    StepRunner: Optional[type] = None
    EpochRunner: Optional[type] = None

    @property
    def accelerator(self) -> Any:
        """accelerate's ``Accelerator`` while ``fit`` trains (torchkeras programs reach it as
        ``model.accelerator``); outside ``fit``, a :class:`~kerastorch.compat.accelerator.LocalAccelerator`
        for this one process (its ``device`` is the net's)."""
        runtime = self.runtime
        if self.fit_step is not None and runtime is not None and runtime.accelerator is not None:
            return runtime.accelerator
        return LocalAccelerator(self.net)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """``model(x)`` is ``model.net(x)``."""
        return self.net(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """``model.forward(x)`` is ``model.net(x)``."""
        return self.net(*args, **kwargs)

    def parameters(self, recurse: bool = True) -> Iterator[torch.nn.Parameter]:
        """The net's parameters (each once)."""
        return self.net.parameters(recurse)

    def named_parameters(self, prefix: str = "", recurse: bool = True) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """The net's named parameters, under the net's own names."""
        return unwrap(self.net).named_parameters(prefix, recurse)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The net's state dict, under the net's own keys (what checkpoints hold)."""
        return unwrap(self.net).state_dict()

    def load_state_dict(self, state_dict: dict, strict: bool = True) -> Any:
        """Load a state dict of the net's keys into the net."""
        return unwrap(self.net).load_state_dict(state_dict, strict)

    def train(self, mode: bool = True) -> Any:
        """Put the net in training mode (``mode=False``: eval mode); returns this model."""
        self.net.train(mode)
        return self

    def eval(self) -> Any:
        """Put the net in eval mode; returns this model."""
        self.net.eval()
        return self

    def to(self, *args: Any, **kwargs: Any) -> Any:
        """Move the net (``model.to(device)``); returns this model. ``fit`` places the net itself."""
        self.net.to(*args, **kwargs)
        return self

    def fit_ddp(
        self,
        num_processes: int = 2,
        train_data: Any = None,
        val_data: Any = None,
        epochs: int = 10,
        **fit_arguments: Any,
    ) -> pd.DataFrame:
        """torchkeras's name for ``fit(..., devices=num_processes)``: train in that many processes
        (GPUs, or CPU processes with ``accelerator="cpu"``) and get the result back in this model.

        Example::

            history = model.fit_ddp(2, dl_train, dl_val, epochs=5, accelerator="cpu")
        """
        if "devices" in fit_arguments:
            raise ValueError("fit_ddp takes num_processes=, which is fit's devices=: pass only one of them.")
        return self.fit(train_data, val_data, epochs, devices=num_processes, **fit_arguments)  # type: ignore[attr-defined]


__all__ = ["ModuleLike"]
