"""How a batch's samples are counted, which weighs its loss and metrics in the epoch's values: the
labels' first dimension, else the outputs', else the inputs' (a list of images: its length). Targets
that are a list of a dict per image (a detector's boxes and labels) are counted one per image, not by
the boxes the first image holds."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

import kerastorch as kt


class Boxes(Dataset):
    """An image's features, and its targets in a detector's format: a dict of boxes and their labels,
    with 0 to 3 boxes per image."""

    def __init__(self, n=30):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 6, generator=g)
        self.counts = torch.randint(0, 4, (n,), generator=g)
        self.counts[0] = 0  # the first batch's first image has no box

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        k = int(self.counts[i])
        return self.x[i], {"boxes": torch.ones(k, 4) * i, "labels": torch.zeros(k, dtype=torch.long)}


def collate(samples):
    images = torch.stack([x for x, _ in samples])
    return images, [target for _, target in samples]  # a list of dicts, as torchvision's detectors take


class BoxCountLoss(nn.Module):
    """The mean over the batch's images of (predicted count - true count)^2."""

    def forward(self, preds, targets):
        counts = torch.tensor([float(len(t["boxes"])) for t in targets])
        return ((preds.squeeze(1) - counts) ** 2).mean()


def per_image_losses(net, dataset):
    with torch.no_grad():
        preds = net(dataset.x).squeeze(1)
    return (preds - dataset.counts.float()) ** 2


def test_a_list_of_dicts_per_image_counts_one_sample_per_image():
    torch.manual_seed(0)
    net = nn.Linear(6, 1)
    data = Boxes()
    loader = DataLoader(data, batch_size=7, collate_fn=collate)  # batches of 7, 7, 7, 7, 2
    model = kt.KerasModel(net, BoxCountLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.0))
    history = model.fit(loader, loader, epochs=1, verbose=0)
    expected = per_image_losses(net, data).mean().item()  # lr=0: the net is the same throughout
    assert history["val_loss"][0] == pytest.approx(expected, rel=1e-6)
    assert history["train_loss"][0] == pytest.approx(expected, rel=1e-6)
    assert model.evaluate(loader, verbose=0)["val_loss"] == pytest.approx(expected, rel=1e-6)


def test_a_batch_whose_first_image_has_no_box_is_still_a_batch():
    # Alone, the first batch (whose first image has no box) was counted as no sample at all.
    torch.manual_seed(0)
    net = nn.Linear(6, 1)
    data = Boxes(n=5)
    loader = DataLoader(data, batch_size=5, collate_fn=collate)
    model = kt.KerasModel(net, BoxCountLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.0))
    scores = model.evaluate(loader, verbose=0)
    assert scores["val_loss"] == pytest.approx(per_image_losses(net, data).mean().item(), rel=1e-6)
