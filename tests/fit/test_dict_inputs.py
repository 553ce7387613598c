"""Dict batches: a net whose ``forward`` takes one dict (pytorch_tabular's style) with
``KerasModel(inputs_as="dict")``, the hint when that is what a failing first batch needs, and any
mapping as a dict batch (a Hugging Face ``BatchEncoding``, which every one of its data collators returns)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import kerastorch as kt


class Tabular(nn.Module):
    """Continuous features and a category's embedding, read from one dict."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(5, 3)
        self.head = nn.Linear(2 + 3, 2)

    def forward(self, x: dict):
        return self.head(torch.cat([x["continuous"], self.embedding(x["categorical"])], dim=1))


class KeywordTabular(Tabular):
    def forward(self, continuous, categorical):
        return super().forward({"continuous": continuous, "categorical": categorical})


def tabular_rows(n=96):
    g = torch.Generator().manual_seed(0)
    continuous = torch.randn(n, 2, generator=g)
    categorical = torch.randint(0, 5, (n,), generator=g)
    target = (continuous[:, 0] + categorical - 2 > 0).long()  # the category's embedding learns its part
    return [{"continuous": continuous[i], "categorical": categorical[i], "target": target[i]} for i in range(n)]


def weights(net):
    return {k: v.detach().clone() for k, v in net.state_dict().items()}


def unchanged(net, before):
    return all(torch.equal(before[k], v) for k, v in net.state_dict().items())


def test_a_net_that_takes_one_dict_trains_evaluates_and_predicts_with_inputs_as_dict():
    torch.manual_seed(0)
    net = Tabular()
    model = kt.KerasModel(
        net,
        nn.CrossEntropyLoss(),
        optimizer=torch.optim.Adam(net.parameters(), lr=0.05),
        labels_at="target",
        inputs_as="dict",
    )
    loader = DataLoader(tabular_rows(), batch_size=16)
    history = model.fit(loader, loader, epochs=15, patience=None, verbose=0)
    assert history["train_loss"].iloc[-1] < 0.5 * history["train_loss"].iloc[0]
    outputs = model.predict(loader, verbose=0)  # the same batches: the labels' key is left out
    batch = next(iter(DataLoader(tabular_rows(), batch_size=96)))
    with torch.no_grad():
        expected = net({"continuous": batch["continuous"], "categorical": batch["categorical"]})
    assert torch.allclose(outputs, expected)
    loss = nn.functional.cross_entropy(expected, batch["target"]).item()
    assert model.evaluate(loader, verbose=0)["val_loss"] == pytest.approx(loss, rel=1e-5)


def test_without_inputs_as_the_first_batch_fails_pointing_to_it_not_to_the_labels_key_already_given():
    net = Tabular()
    before = weights(net)
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), labels_at="target")
    with pytest.raises(TypeError) as failure:
        model.fit(DataLoader(tabular_rows(), batch_size=16), epochs=1, verbose=0)
    said = str(failure.value)
    assert "unexpected keyword argument 'continuous'" in said
    assert "kerastorch called net(continuous=..., categorical=...)" in said
    assert "forward takes one argument, x" in said and "KerasModel(..., inputs_as='dict')" in said
    assert "labels_at=" not in said
    assert unchanged(net, before)


def test_inputs_as_dict_for_a_net_that_takes_keywords_says_to_drop_it():
    net = KeywordTabular()
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), labels_at="target", inputs_as="dict")
    with pytest.raises(TypeError) as failure:
        model.fit(DataLoader(tabular_rows(), batch_size=16), epochs=1, verbose=0)
    said = str(failure.value)
    assert "kerastorch called net({'continuous': ..., 'categorical': ...})" in said
    assert "forward takes continuous, categorical: drop inputs_as" in said
    history = kt.KerasModel(net, nn.CrossEntropyLoss(), labels_at="target").fit(
        DataLoader(tabular_rows(), batch_size=16), epochs=1, verbose=0
    )
    assert len(history) == 1


def test_inputs_as_is_checked_when_the_model_is_built():
    with pytest.raises(ValueError, match=r"inputs_as='one'; give 'keywords'.*or 'dict'"):
        kt.KerasModel(Tabular(), nn.CrossEntropyLoss(), inputs_as="one")


@pytest.mark.slow
def test_a_hugging_face_collators_batch_encoding_is_a_dict_batch_for_fit_evaluate_and_predict():
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["[PAD]", "[UNK]", "good", "bad", "movie", "very", "not"]
    tokens = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tokens.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=tokens, pad_token="[PAD]", unk_token="[UNK]")
    texts = ["good movie", "very good movie", "bad movie", "not good", "very bad", "good"] * 4
    rows = [{**tokenizer(text), "labels": int("bad" not in text and "not" not in text)} for text in texts]
    loader = DataLoader(rows, batch_size=8, collate_fn=transformers.DataCollatorWithPadding(tokenizer))
    batch = next(iter(loader))
    assert isinstance(batch, transformers.BatchEncoding) and not isinstance(batch, dict)
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=len(words), hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16
    )
    net = transformers.BertForSequenceClassification(config)
    model = kt.KerasModel(net, optimizer=torch.optim.Adam(net.parameters(), lr=1e-2))  # the net's own loss
    history = model.fit(loader, loader, epochs=5, patience=None, verbose=0)
    assert history["val_loss"].iloc[-1] < history["val_loss"].iloc[0]
    logits = model.predict(loader, concatenate=False, verbose=0)  # padded per batch
    assert [tuple(x.shape) for x in logits] == [(8, 2)] * 3
    net.eval()
    with torch.no_grad():
        expected = torch.stack([net(**b).loss for b in loader]).mean().item()  # batches of 8 alike
    assert model.evaluate(loader, verbose=0)["val_loss"] == pytest.approx(expected, rel=1e-5)
