"""Users with an unusual batch override one method, not the loop."""

from __future__ import annotations

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
