"""``predict``'s outputs when the batches are not the usual equal-sized ones: a DataLoader with
``batch_size=None`` (each "batch" is one sample, so the outputs are stacked), and outputs whose
shapes differ from batch to batch past the first dimension (a tagger on sequences padded per
batch), refused with the shapes named, or returned as a list with ``concatenate=False``.

Every expected value is the net itself, called in eval mode on the same inputs.
"""

from __future__ import annotations

from collections import namedtuple

import pytest
import torch
from torch import nn
from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset

import kerastorch as kt

Pair = namedtuple("Pair", ["logits", "score"])


class TwoHeads(nn.Module):
    """(features,) -> a named tuple and a dict: a (2,) tensor and a scalar per sample."""

    def __init__(self, as_dict: bool = False):
        super().__init__()
        torch.manual_seed(0)
        self.body, self.as_dict = nn.Linear(4, 2), as_dict

    def forward(self, x):
        logits = self.body(x)
        score = logits.sum(-1)
        return {"logits": logits, "score": score} if self.as_dict else Pair(logits, score)


def test_predict_stacks_the_outputs_of_a_loader_whose_batches_are_single_samples():
    torch.manual_seed(0)
    X = torch.randn(64, 4)
    y = (X[:, 0] > 0).long()
    samples = DataLoader(TensorDataset(X, y), batch_size=None)  # automatic batching off
    net = nn.Linear(4, 2)
    model = kt.KerasModel(net, nn.CrossEntropyLoss())
    with torch.no_grad():
        expected = net.eval()(X)

    predicted = model.predict(samples, verbose=0)

    assert predicted.shape == (64, 2)  # not (128,): one row per sample
    torch.testing.assert_close(predicted, expected)
    torch.testing.assert_close(model.predict(samples, steps=5, verbose=0), expected[:5])
    for as_dict in (False, True):
        heads = TwoHeads(as_dict)
        with torch.no_grad():
            logits = heads.eval().body(X)
        out = kt.KerasModel(heads, nn.CrossEntropyLoss()).predict(DataLoader(X, batch_size=None), verbose=0)
        assert type(out) is (dict if as_dict else Pair)
        torch.testing.assert_close(out["logits"] if as_dict else out.logits, logits)
        torch.testing.assert_close(out["score"] if as_dict else out.score, logits.sum(1))  # (64,): scalars stacked


def test_predict_joins_batches_a_dataset_makes_itself_and_refuses_items_it_cannot_read():
    torch.manual_seed(0)
    X = torch.randn(60, 4)
    net = nn.Linear(4, 2)
    model = kt.KerasModel(net, nn.CrossEntropyLoss())
    with torch.no_grad():
        expected = net.eval()(X)
    made_batches = DataLoader(list(X.split(20)), batch_size=None)  # torch's way for data that batches itself
    torch.testing.assert_close(model.predict(made_batches, verbose=0), expected)
    # A BatchSampler given as sampler= (a fast way to batch a TensorDataset): its items are batches too,
    # 16, 16, 16 and 12 rows.
    indices = BatchSampler(SequentialSampler(range(60)), batch_size=16, drop_last=False)
    sampled = DataLoader(TensorDataset(X), sampler=indices, batch_size=None)
    torch.testing.assert_close(model.predict(sampled, verbose=0), expected)

    rows = DataLoader(list(X), batch_size=None)  # one sample per item, but a list could hold either
    with pytest.raises(ValueError, match=r"for item 0 the input has shape \(4,\) and the net's output \(2,\)"):
        model.predict(rows, verbose=0)
    listed = model.predict(rows, verbose=0, concatenate=False)
    torch.testing.assert_close(torch.stack(listed), expected)


class Tagger(nn.Module):
    """A tag per token: (batch, length) token ids -> (batch, length, tags) scores."""

    def __init__(self, vocab: int = 20, tags: int = 3):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, 8)
        self.gru = nn.GRU(8, 8, batch_first=True)
        self.out = nn.Linear(8, tags)

    def forward(self, tokens):
        return self.out(self.gru(self.embed(tokens))[0])


LENGTHS = [5, 7, 3, 7, 2, 7, 6, 4, 3, 6, 5, 2, 4]  # padded per batch of 4: lengths 7, 7, 6, 4


def tagged_sequences(vocab: int = 20) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(0)
    tokens = [torch.randint(1, vocab, (n,), generator=generator) for n in LENGTHS]
    return [(t, t % 3) for t in tokens]


def pad(samples):
    """A collate_fn that pads each batch to its own longest sequence (labels with -100)."""
    tokens = nn.utils.rnn.pad_sequence([t for t, _ in samples], batch_first=True)
    tags = nn.utils.rnn.pad_sequence([g for _, g in samples], batch_first=True, padding_value=-100)
    return tokens, tags


def test_predict_refuses_outputs_that_differ_past_the_first_dimension_naming_the_shapes():
    loader = DataLoader(tagged_sequences(), batch_size=4, collate_fn=pad)
    model = kt.KerasModel(Tagger(), nn.CrossEntropyLoss(ignore_index=-100))
    with pytest.raises(ValueError) as refused:
        model.predict(loader, verbose=0)
    message = str(refused.value)
    assert "the shape of outputs is (4, 7, 3) in batch 0 and (4, 6, 3) in batch 2" in message
    assert "concatenate=False" in message and "pad every sequence to one length" in message


def test_predict_with_concatenate_false_returns_each_batch_outputs_as_the_net_gives_them():
    loader = DataLoader(tagged_sequences(), batch_size=4, collate_fn=pad)
    net = Tagger()
    model = kt.KerasModel(net, nn.CrossEntropyLoss(ignore_index=-100))
    with torch.no_grad():
        expected = [net.eval()(tokens) for tokens, _ in loader]

    listed = model.predict(loader, verbose=0, concatenate=False)

    assert isinstance(listed, list)
    assert [tuple(o.shape) for o in listed] == [(4, 7, 3), (4, 7, 3), (4, 6, 3), (1, 4, 3)]
    for got, want in zip(listed, expected):
        torch.testing.assert_close(got, want)
    first_two = model.predict(loader, steps=2, verbose=0)  # equal shapes still concatenate
    torch.testing.assert_close(first_two, torch.cat(expected[:2]))
    with pytest.raises(TypeError, match=r"concatenate='no' must be True or False"):
        model.predict(loader, concatenate="no")
