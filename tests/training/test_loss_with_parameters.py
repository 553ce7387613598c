"""A loss with learnable parameters and buffers: lr_find and doctor leave it as it was, resume keeps it, two processes refuse it."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from small_runs import loaders, make_model, mlp, same
from torch import nn

from helpers import accuracy

# -- 6. a loss with learnable parameters and buffers --------------------------------------------


class TemperatureLoss(nn.Module):
    """Cross-entropy with a learned temperature, counting the batches it saw in a buffer."""

    def __init__(self):
        super().__init__()
        self.log_temperature = nn.Parameter(torch.zeros(()))
        self.register_buffer("batches", torch.zeros((), dtype=torch.long))

    def forward(self, preds, labels):
        if self.training:
            self.batches += 1
        return nn.functional.cross_entropy(preds / self.log_temperature.exp(), labels)


class Counting(nn.Module):
    """A net with a buffer kept out of the state_dict (``persistent=False``) that forward changes."""

    def __init__(self):
        super().__init__()
        self.body = mlp()
        self.register_buffer("seen", torch.zeros(()), persistent=False)

    def forward(self, x):
        self.seen += x.shape[0]
        return self.body(x)


def model_with_learned_loss(net=None):
    net = net if net is not None else mlp()
    loss = TemperatureLoss()
    optimizer = torch.optim.Adam([*net.parameters(), *loss.parameters()], lr=0.05)
    return make_model(net, loss, optimizer=optimizer, metrics={"acc": accuracy})


def loss_state(model):
    return {k: v.detach().clone() for k, v in model.loss_fn.state_dict().items()}


def test_lr_find_and_doctor_leave_the_loss_and_non_persistent_buffers_as_they_were():
    model = model_with_learned_loss(Counting())
    train, val = loaders()
    loss_before, seen_before = loss_state(model), model.net.seen.clone()
    model.lr_find(train, num_steps=30)
    assert same(loss_state(model), loss_before) and torch.equal(model.net.seen, seen_before)
    model.doctor(train, val)
    assert same(loss_state(model), loss_before) and torch.equal(model.net.seen, seen_before)


def test_resume_keeps_the_losss_parameters_and_buffers(tmp_path):
    straight = model_with_learned_loss()
    straight_history = straight.fit(*loaders(), epochs=4, patience=None, verbose=0)
    first = model_with_learned_loss()
    first.fit(*loaders(), epochs=2, patience=None, verbose=0, ckpt_path=tmp_path / "best.pt", resume=True)
    again = model_with_learned_loss()
    train, val = loaders()
    history = again.fit(train, val, epochs=4, patience=None, verbose=0, ckpt_path=tmp_path / "best.pt", resume=True)
    pd.testing.assert_frame_equal(history, straight_history, check_exact=True)
    assert same(loss_state(again), loss_state(straight))


def test_ddp_refuses_a_loss_with_parameters_before_starting_processes(digits):
    model = model_with_learned_loss(nn.Sequential(nn.Linear(64, 10)))
    with pytest.raises(ValueError, match=r"log_temperature.*not parameters of the net.*devices=1"):
        model.fit(*digits, epochs=1, verbose=0, accelerator="cpu", devices=2)
