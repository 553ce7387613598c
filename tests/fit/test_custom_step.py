"""Users with an unusual batch override one method, not the loop."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt


class LabelsFirst(kt.KerasModel):
    """Batches arrive as (labels, features) and the loss adds an L2 penalty."""

    def forward_batch(self, batch):
        labels, features = batch
        preds = self.net(features)
        penalty = sum((p**2).sum() for p in self.net.parameters())
        return nn.functional.cross_entropy(preds, labels) + 1e-4 * penalty, preds, labels

    def predict_batch(self, batch):
        return self.net(batch[1])


def test_overriding_forward_batch_changes_the_step_for_fit_evaluate_and_predict(digits8):
    x, y = digits8[0].tensors
    loader = DataLoader(TensorDataset(y, x), batch_size=64, shuffle=True)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    model = LabelsFirst(
        net,
        metrics_dict={"acc": lambda p, t: (p.argmax(1) == t).float().mean()},
        optimizer=torch.optim.Adam(net.parameters(), lr=1e-2),
    )  # no loss_fn needed
    history = model.fit(loader, loader, epochs=3, verbose=0)
    assert history["val_acc"].iloc[-1] > 0.85
    assert model.predict(loader).shape == (len(y), 10)


def test_the_trial_of_a_step_of_your_own_leaves_its_own_scheduler_as_it_was():
    # Before training, fit tries the step once and puts everything back: the model's own optimizers,
    # and their schedulers too (a GAN's discriminator schedule ended one step ahead).
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    y = (x[:, 0] > 0).long()

    class OwnSchedule(kt.KerasModel):
        def __init__(self, net):
            super().__init__(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
            self.head_optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
            self.head_scheduler = torch.optim.lr_scheduler.StepLR(self.head_optimizer, step_size=3, gamma=0.5)

        def train_step(self, batch):
            with self.autocast():
                loss, preds, labels = self.forward_batch(batch)
            self.backward(loss)
            self.optimizer_step(self.head_optimizer)
            self.head_scheduler.step()
            return loss, preds, labels

    model = OwnSchedule(nn.Linear(4, 2))
    model.fit(DataLoader(TensorDataset(x, y), batch_size=16), epochs=1, verbose=0, monitor=None)
    assert model.head_scheduler.last_epoch == 4  # the 4 batches, not the trial's extra step
    assert model.head_optimizer.param_groups[0]["lr"] == pytest.approx(0.05 * 0.5)
