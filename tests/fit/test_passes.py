"""Programs whose batches or net need more than the defaults, each way as the docs give it: a triplet
loss, whose batches hold no labels (``forward_batch`` returns labels ``None``, for training, validation
and ``evaluate``; ``predict_batch`` for ``predict``), and a character RNN that carries its state from
batch to batch, reset at the start of every pass by one callback given to ``fit``, ``evaluate`` and
``predict``."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt

# -- a triplet loss: batches of (anchor, positive, negative), no labels -------------------------------


def triplets(points, classes, indices):
    rows = []
    for i in indices:
        same = [j for j in indices if classes[j] == classes[i] and j != i]
        other = [j for j in indices if classes[j] != classes[i]]
        rows.append((points[i], points[same[i % len(same)]], points[other[i % len(other)]]))
    return rows


class TripletModel(kt.KerasModel):
    def forward_batch(self, batch):
        anchor, positive, negative = (self.net(x) for x in batch)
        return self.loss_fn(anchor, positive, negative), anchor, None

    def predict_batch(self, batch):
        return self.net(batch[0])


def test_a_triplet_loss_without_labels_trains_validates_evaluates_and_predicts_through_forward_batch():
    kt.seed_everything(0)
    points = torch.randn(120, 4)
    classes = (points[:, 0] > 0).long()
    dl_train = DataLoader(triplets(points, classes, range(90)), batch_size=16, shuffle=True)
    val_rows = triplets(points, classes, range(90, 120))
    dl_val = DataLoader(val_rows, batch_size=16)  # 16 and 14
    net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    model = TripletModel(net, nn.TripletMarginLoss(), optimizer=torch.optim.Adam(net.parameters(), lr=1e-2))
    history = model.fit(dl_train, dl_val, epochs=5, verbose=0)
    assert list(history.columns) == ["epoch", "train_loss", "lr", "val_loss"]
    assert history["val_loss"].iloc[-1] < history["val_loss"].iloc[0]
    with torch.no_grad():
        anchor, positive, negative = (net(torch.stack(part)) for part in zip(*val_rows))
        per_triplet = nn.TripletMarginLoss(reduction="none")(anchor, positive, negative)
    assert model.evaluate(dl_val, verbose=0)["val_loss"] == pytest.approx(per_triplet.mean().item(), rel=1e-5)
    assert history["val_loss"].min() == pytest.approx(per_triplet.mean().item(), rel=1e-5)  # best weights back
    embeddings = model.predict(dl_val, verbose=0)
    assert torch.allclose(embeddings, anchor)


# -- a character RNN that carries its state across batches ---------------------------------------------


class CharRNN(nn.Module):
    def __init__(self, vocab, hidden=24):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.rnn = nn.GRU(hidden, hidden, batch_first=True)
        self.out = nn.Linear(hidden, vocab)
        self.state = None

    def reset_state(self):
        self.state = None

    def forward(self, x):
        h, state = self.rnn(self.embed(x), self.state)
        self.state = state.detach()  # carried to the next chunk of the stream, without its graph
        return self.out(h).transpose(1, 2)  # (batch, classes, time), as CrossEntropyLoss takes it


class ResetState(kt.Callback):
    """Each pass over the data starts afresh: training, validation, evaluate and predict."""

    def on_epoch_begin(self, epoch, logs=None):
        self.model.net.reset_state()

    def on_test_begin(self, logs=None):
        self.model.net.reset_state()

    def on_predict_begin(self, logs=None):
        self.model.net.reset_state()


def stream(ids, length=10):
    n = (len(ids) - 1) // length
    return TensorDataset(ids[: n * length].view(n, length), ids[1 : n * length + 1].view(n, length))


def test_a_stateful_net_reset_by_one_callback_evaluates_as_fit_validated_it_and_predicts_alike():
    kt.seed_everything(0)
    text = "hello world, hello kerastorch. " * 12
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text])
    cut = int(len(ids) * 0.8)
    dl_train, dl_val = DataLoader(stream(ids[:cut])), DataLoader(stream(ids[cut:]))  # one chunk a batch, in order
    net = CharRNN(len(chars))
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(net.parameters(), lr=1e-2))
    reset = ResetState()
    history = model.fit(dl_train, dl_val, epochs=3, verbose=0, callbacks=[reset])
    best = history["val_loss"].min()
    assert model.evaluate(dl_val, verbose=0, callbacks=[reset])["val_loss"] == pytest.approx(best, rel=1e-6)
    # Without the callback, evaluate goes on from the state the last pass left: another value.
    assert model.evaluate(dl_val, verbose=0)["val_loss"] != pytest.approx(best, rel=1e-3)
    first = model.predict(dl_val, verbose=0, callbacks=[reset])
    assert torch.equal(model.predict(dl_val, verbose=0, callbacks=[reset]), first)  # each pass from a fresh state
