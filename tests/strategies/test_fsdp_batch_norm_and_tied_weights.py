"""FSDP with BatchNorm, tied weights and EMA: as DDP, or refused by name before training."""

from __future__ import annotations

import pandas as pd
import pytest
import torch
from small_runs import batch_norm_model, digits_for_processes, digits_model, same, weights_of
from torch import nn

import kerastorch as kt

# -- 5. FSDP with BatchNorm: the history DDP gives, evaluate() of the returned net, exact resume -----


@pytest.mark.slow
def test_fsdp_with_batch_norm_validates_as_ddp_does_and_as_evaluate_does_and_resumes_exactly(digits8, tmp_path):
    runs = {}
    for strategy in ("ddp", "fsdp"):
        model = batch_norm_model()
        history = model.fit(
            *digits_for_processes(digits8), epochs=4, patience=None, verbose=0, accelerator="cpu", devices=2,
            strategy=strategy,
        )  # fmt: skip
        runs[strategy] = (model, history)
    (_, ddp_history), (fsdp, fsdp_history) = runs["ddp"], runs["fsdp"]
    for column in ("train_loss", "val_loss", "val_acc"):
        assert fsdp_history[column].tolist() == pytest.approx(ddp_history[column].tolist(), rel=1e-4, abs=1e-5)
    val = digits_for_processes(digits8)[1]
    for model, history in runs.values():
        best = history.loc[history["val_loss"].idxmin()]
        assert model.evaluate(val, quiet=True)["val_loss"] == pytest.approx(best["val_loss"], rel=1e-6)

    ckpt = tmp_path / "best.safetensors"
    options = dict(patience=None, verbose=0, accelerator="cpu", devices=2, strategy="fsdp", ckpt_path=ckpt, resume=True)
    batch_norm_model().fit(*digits_for_processes(digits8), epochs=2, **options)
    resumed = batch_norm_model()
    history = resumed.fit(*digits_for_processes(digits8), epochs=4, **options)
    pd.testing.assert_frame_equal(history, fsdp_history, check_exact=True)
    assert same(weights_of(resumed.net), weights_of(fsdp.net))


# -- 16. FSDP and tied weights, FSDP and EMA ----------------------------------------------------


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.layer = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.relu(self.layer(x))


class TiedLanguageModel(nn.Module):
    """Embedding and output layer share one weight, as in GPT-2."""

    def __init__(self, vocabulary=20, width=16):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocabulary, width)
        self.blocks = nn.Sequential(Block(width), Block(width))
        self.head = nn.Linear(width, vocabulary, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens)))


def tokens(n=192, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 20, (n,), generator=g)
    return x, (x + 1) % 20  # predict the next token


def test_fsdp_refuses_tied_weights_split_over_shards_naming_them_and_the_wrap_option():
    net = TiedLanguageModel()
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), {}, torch.optim.Adam(net.parameters(), lr=1e-2))
    with pytest.raises(ValueError, match=r"(?s)embed\.weight.*head\.weight.*FSDP\(wrap=\[Block\]\)"):
        model.fit(*tokens(), epochs=1, verbose=0, accelerator="cpu", devices=2, strategy="fsdp")


@pytest.mark.slow
def test_fsdp_trains_tied_weights_with_the_wrap_its_message_suggests():
    net = TiedLanguageModel()
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), {}, torch.optim.Adam(net.parameters(), lr=1e-2))
    strategy = kt.strategies.FSDP(wrap=[Block])
    x, y = tokens()
    history = model.fit(x, y, validation_data=tokens(seed=1), epochs=2, verbose=0, accelerator="cpu", devices=2,
                        strategy=strategy)  # fmt: skip
    assert len(history) == 2 and net.head.weight is net.embed.weight  # still tied in the returned net


@pytest.mark.slow
def test_ema_with_fsdp_is_refused_by_name_before_training(digits):
    model = digits_model()
    before = weights_of(model.net)
    with pytest.raises(ValueError, match=r"EMA keeps a whole copy of the net.*strategy='ddp'"):
        model.fit(*digits, epochs=1, verbose=0, accelerator="cpu", devices=2, strategy="fsdp",
                  callbacks=[kt.callbacks.EMA(0.9)])  # fmt: skip
    assert same(weights_of(model.net), before)
