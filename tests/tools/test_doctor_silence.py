"""The doctor stays silent on correct setups and still finds the mistakes beside them."""

from __future__ import annotations

import pytest
import torch
from small_runs import blobs, loaders, make_model, mlp
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# -- 12. doctor: correct setups stay silent --------------------------------------------------


class LoRALinear(nn.Module):
    """A frozen layer plus a trainable low-rank update B @ A, B starting at zero (LoRA)."""

    def __init__(self, base, rank=4):
        super().__init__()
        self.base = base.requires_grad_(False)
        self.A = nn.Parameter(torch.randn(rank, base.in_features) * 0.1)
        self.B = nn.Parameter(torch.zeros(base.out_features, rank))

    def forward(self, x):
        return self.base(x) + x @ self.A.T @ self.B.T


class ZeroResidual(nn.Module):
    """x + branch(x), the branch's last layer initialised to zero (Fixup, ResNet's zero-init)."""

    def __init__(self, width):
        super().__init__()
        self.branch = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, width))
        nn.init.zeros_(self.branch[2].weight)
        nn.init.zeros_(self.branch[2].bias)

    def forward(self, x):
        return x + self.branch(x)


def bce_with_one_logit():
    x, y = blobs(classes=2)
    return make_model(mlp(outputs=1), nn.BCEWithLogitsLoss()), loaders(x, y.float().reshape(-1, 1))


def label_smoothing():
    return make_model(loss_fn=nn.CrossEntropyLoss(label_smoothing=0.1)), loaders()


def lora():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), LoRALinear(nn.Linear(16, 3)))
    trainable = [p for p in net.parameters() if p.requires_grad]
    return make_model(net, optimizer=torch.optim.Adam(trainable, lr=0.05)), loaders()


def zero_initialised_residual_branches():
    torch.manual_seed(0)
    return make_model(nn.Sequential(nn.Linear(2, 16), ZeroResidual(16), ZeroResidual(16), nn.Linear(16, 3))), loaders()


def warm_up_from_lr_zero():
    net = mlp()
    optimizer = torch.optim.Adam(net.parameters(), lr=0.05)
    warm_up = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: min(1.0, epoch / 5))
    return make_model(net, optimizer=optimizer, lr_scheduler=warm_up), loaders()


def duplicated_tabular_rows():
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 3, (400, 3), generator=g).float()  # three categorical features: 27 distinct rows
    y = ((x.sum(1) + torch.randint(0, 2, (400,), generator=g)) > 3).long()
    return make_model(mlp(inputs=3, outputs=2)), loaders(x, y)


def multi_label_tags():
    x, _ = blobs()
    tags = torch.stack([x[:, 0] > 3.6, x[:, 1] > 3.6, x[:, 0] - x[:, 1] > 3.6], 1).float()  # three rare tags
    return make_model(mlp(outputs=3), nn.BCEWithLogitsLoss()), loaders(x, tags)


@pytest.mark.parametrize(
    "setup",
    [
        bce_with_one_logit,
        label_smoothing,
        lora,
        zero_initialised_residual_branches,
        warm_up_from_lr_zero,
        duplicated_tabular_rows,
        multi_label_tags,
    ],
)
def test_the_doctor_stays_silent_on_a_correct_setup(setup):
    model, (train, val) = setup()
    report = model.doctor(train, val)
    assert not report.errors and not report.warnings, str(report)


def test_the_doctor_still_finds_a_sigmoid_before_bce_with_logits_and_a_leak_among_duplicates():
    x, y = blobs(classes=2)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 1), nn.Sigmoid())
    report = make_model(net, nn.BCEWithLogitsLoss()).doctor(*loaders(x, y.float().reshape(-1, 1)))
    assert "logits_not_probabilities" in {f.check for f in report.warnings}, str(report)
    # distinct rows, and a validation set copied from the training set: a leak, whatever the duplicates elsewhere
    train = DataLoader(TensorDataset(x[:300], y[:300]), batch_size=32, shuffle=True)
    report = make_model(mlp(outputs=2)).doctor(train, DataLoader(TensorDataset(x[:100], y[:100]), batch_size=50))
    assert "train_val_overlap" in {f.check for f in report.warnings}, str(report)


def test_the_doctor_still_names_a_parameter_that_never_gets_a_gradient_beside_lora():
    class Spare(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), LoRALinear(nn.Linear(16, 3)))
            self.dead = nn.Linear(2, 3)
            nn.init.zeros_(self.dead.weight)

        def forward(self, x):
            return self.body(x) + 0 * self.dead(x)  # connected, but its gradient is zero forever

    model = make_model(Spare())
    report = model.doctor(*loaders())
    warned = " ".join(f.message for f in report.warnings if f.check == "all_parameters_learn")
    assert "dead.weight" in warned and "body.2.A" not in warned and "body.2.B" not in warned
