"""The paths a run writes to (``ckpt_path``, ``ModelCheckpoint``) are checked before the first batch:
a path that cannot be written fails ``fit`` with the weights as they were and nothing on disk."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import kerastorch as kt
from conftest import make_mlp


def sgd_model():
    net = make_mlp()
    return kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))


def weights(model):
    return {k: v.clone() for k, v in model.net.state_dict().items()}


def refused_before_training(loaders, match, **fit_options):
    model = sgd_model()
    before = weights(model)
    with pytest.raises(ValueError, match=match):
        model.fit(*loaders, epochs=2, verbose=0, **fit_options)
    assert all(torch.equal(before[k], v) for k, v in model.net.state_dict().items())


def test_a_path_ending_with_a_separator_is_refused_as_a_folder(loaders, tmp_path):
    refused_before_training(
        loaders, r"ckpt_path='.*runs/' ends with '/', so it names a folder", ckpt_path=f"{tmp_path}/runs/"
    )
    with pytest.raises(ValueError, match=r"ModelCheckpoint filepath '.*ckpt/' ends with '/'"):
        kt.callbacks.ModelCheckpoint(f"{tmp_path}/ckpt/")
    assert list(tmp_path.iterdir()) == []
