"""Nets the user already spread over several devices (model parallel, seed 002).

A net whose encoder sits on ``cuda:0`` and decoder on ``cuda:1`` is recognised from
its parameters' devices and never moved. Its inputs go to the device of its first
parameters (the first submodule), and the labels, the loss and the metrics live where
its outputs come out, found by running the first batch through it once.

Example::

    net = Seq2Seq()                   # net.encoder.to("cuda:0"); net.decoder.to("cuda:1")
    model = kt.KerasModel(net, loss_fn, metrics_dict, optimizer)
    model.fit(dl_train, dl_val)       # one process; fit leaves every submodule where it is
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from accelerate.utils import send_to_device
from torch import nn

from ..data.batches import first_tensor
from ..data.peek import dry_run_first_batch
from ..helpers.protocols import TrainableModel
from .base import R
from .single import SingleDevice


class ModelParallel(SingleDevice):
    """One process trains a net whose pieces the user placed on several devices; fit moves none of them."""

    name = "model parallel"
    moves_net = False

    def runtime_for(self, runtime: R, model: TrainableModel, data: Any) -> R:
        """Batches go to the net's first device; outputs, labels, loss and metrics live where they come out."""
        adjusted: Any = runtime  # the run's Runtime, a dataclass
        return dataclasses.replace(adjusted, device=input_device(model.net), output_device=output_device(model, data))


def parameter_devices(net: nn.Module) -> list[torch.device]:
    """The devices holding the net's parameters and buffers, in the order the net registers them."""
    devices: list[torch.device] = []
    for tensor in [*net.parameters(), *net.buffers()]:
        if tensor.device not in devices:
            devices.append(tensor.device)
    return devices


def is_model_parallel(net: nn.Module) -> bool:
    """True when the net's parameters are on more than one device (placed there by the user)."""
    return len(parameter_devices(net)) > 1


def check_one_process(net: nn.Module, num_processes: int) -> None:
    """A model-parallel net trains in one process; say so before any process starts."""
    if num_processes > 1 and is_model_parallel(net):
        devices = ", ".join(str(d) for d in parameter_devices(net))
        raise ValueError(
            f"The net's parameters are on several devices ({devices}): it is model parallel, which trains in one "
            f"process, but {num_processes} processes were asked for. Pass devices=1 (fit leaves each piece where it "
            "is), or put the whole net on one device to train copies of it in several processes."
        )


def input_device(net: nn.Module) -> torch.device:
    """Where inputs go: the device of the net's first parameters (its first submodule)."""
    devices = parameter_devices(net)
    return devices[0] if devices else torch.device("cpu")


def output_device(model: TrainableModel, data: Any) -> torch.device:
    """Where the net's outputs come out: one batch through it, in eval mode, without gradients."""
    first_device = input_device(model.net)
    outputs = dry_run_first_batch(
        model.net, data, "The data", lambda batch: model.predict_batch(send_to_device(batch, first_device))
    )
    found = first_tensor(outputs)
    return found.device if found is not None else first_device


__all__ = ["ModelParallel", "check_one_process", "is_model_parallel", "parameter_devices"]
