"""DDP: a parameter the forward pass does not use is named before training, and the option it names trains."""

from __future__ import annotations

import pytest
import torch
from small_runs import same, weights_of
from torch import nn

import kerastorch as kt

# -- 9. DDP and a parameter the forward pass does not use ------------------------------------------


class WithSpareHead(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
        self.spare_head = nn.Linear(32, 2)  # defined, not used by forward

    def forward(self, x):
        return self.body(x)


@pytest.mark.slow
def test_ddp_names_a_parameter_unused_in_the_forward_pass_before_training_and_takes_the_option(digits):
    net = WithSpareHead()
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), {}, torch.optim.Adam(net.parameters(), lr=1e-2))
    before = weights_of(net)
    with pytest.raises(ValueError, match=r"spare_head\.weight.*DDP\(find_unused_parameters=True\)"):
        model.fit(*digits, epochs=2, verbose=0, accelerator="cpu", devices=2)
    assert same(weights_of(net), before)
    strategy = kt.strategies.DDP(find_unused_parameters=True)
    history = model.fit(*digits, epochs=2, verbose=0, accelerator="cpu", devices=2, strategy=strategy)
    assert len(history) == 2 and history["val_loss"].iloc[-1] < history["val_loss"].iloc[0]
    assert torch.equal(net.spare_head.weight, before["spare_head.weight"])  # unused: never changed
