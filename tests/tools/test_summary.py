"""``kt.summary``: exact parameter counts on nets where simpler tools get them wrong."""

import pytest
import torch
from torch import nn

import kerastorch as kt
from kerastorch.examples import create_cnn


def n_params(net: nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


def rows_of(info) -> list[tuple]:
    return [tuple(r) for r in info.table[["layer", "output_shape", "params", "reused"]].itertuples(index=False)]


def test_seed_cnn_table_shapes_and_totals(capsys):
    net = create_cnn()
    info = kt.summary(net, input_shape=(1, 28, 28))
    assert info.total_params == n_params(net) == 53_994
    assert info.trainable_params == 53_994 and info.non_trainable_params == 0
    assert info.params_size_mb == pytest.approx(53_994 * 4 / 1024**2)
    assert rows_of(info)[0] == ("conv1 (Conv2d)", "[-1, 32, 26, 26]", 320, False)
    assert rows_of(info)[-1] == ("linear2 (Linear)", "[-1, 10]", 330, False)
    assert len(info.table) == 10  # one row per layer, no row for the Sequential itself
    printed = capsys.readouterr().out
    assert "Total params: 53,994" in printed and "Params size (MB): 0.205971" in printed
    assert "[-1, 64, 9, 9]" in printed


class WithOwnParameter(nn.Module):
    """A container holding a parameter itself (a class token), beside its children."""

    def __init__(self):
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(1, 1, 8))
        self.encoder = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.head = nn.Linear(8, 3)

    def forward(self, x):
        tokens = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        return self.head(self.encoder(tokens)[:, 0])


def test_parameters_held_by_a_container_are_counted_on_its_row():
    net = WithOwnParameter()
    info = kt.summary(net, input_data=torch.randn(4, 5, 8), print_table=False)
    assert info.total_params == n_params(net) == 8 + 72 + 27
    # Rows come in call order: the container opens before its children run.
    assert rows_of(info) == [
        ("WithOwnParameter", "[-1, 3]", 8, False),
        ("encoder.0 (Linear)", "[-1, 6, 8]", 72, False),
        ("encoder.1 (ReLU)", "[-1, 6, 8]", 0, False),
        ("head (Linear)", "[-1, 3]", 27, False),
    ]


class SharedLayer(nn.Module):
    """One Linear called twice, registered under two names, plus tied weights and an unused layer."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 6)
        self.block = nn.Linear(6, 6)
        self.block_again = self.block  # the same module under a second name
        self.decode = nn.Linear(6, 10, bias=False)
        self.decode.weight = self.embed.weight  # tied weights: one tensor in two modules
        self.unused = nn.Linear(2, 2)

    def forward(self, ids):
        return self.decode(self.block_again(torch.relu(self.block(self.embed(ids)))))


def test_shared_modules_and_tied_weights_are_counted_once():
    net = SharedLayer()
    info = kt.summary(net, input_data=torch.randint(0, 10, (2, 7)), print_table=False)
    assert info.total_params == n_params(net) == 60 + 42 + 6  # embed, block, unused
    assert rows_of(info) == [
        ("embed (Embedding)", "[-1, 7, 6]", 60, False),
        ("block (Linear)", "[-1, 7, 6]", 42, False),
        ("block (Linear)", "[-1, 7, 6]", 0, True),  # the second call: counted above
        ("decode (Linear)", "[-1, 7, 10]", 0, False),  # its weight is embed's
        ("unused (Linear)", "(not called)", 6, False),
    ]
    assert sum(info.table["params"]) == info.total_params


class TwoInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.image = nn.Linear(12, 4)
        self.meta = nn.Linear(3, 4)

    def forward(self, image, meta):
        return self.image(image) + self.meta(meta)


def test_two_inputs_as_a_tuple_or_as_shapes():
    net = TwoInputs()
    from_data = kt.summary(net, input_data=(torch.randn(5, 12), torch.randn(5, 3)), print_table=False)
    from_shapes = kt.summary(net, input_shape=[(12,), (3,)], print_table=False)
    assert from_data.total_params == from_shapes.total_params == n_params(net) == 52 + 16
    assert list(from_data.table["output_shape"]) == ["[-1, 4]", "[-1, 4]"]


class KeywordInputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.words = nn.EmbeddingBag(20, 4)
        self.numbers = nn.Linear(2, 4)

    def forward(self, input_ids, features):
        return {"score": self.words(input_ids) + self.numbers(features)}


class OneDictInput(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 1)

    def forward(self, batch):
        return self.fc(batch["x"])


def test_dict_inputs_become_keywords_or_one_argument():
    net = KeywordInputs()
    info = kt.summary(
        net, input_data={"input_ids": torch.randint(0, 20, (3, 5)), "features": torch.randn(3, 2)}, print_table=False
    )
    assert info.total_params == n_params(net) == 80 + 12
    single = OneDictInput()
    info = kt.summary(single, input_data={"x": torch.randn(2, 3)}, print_table=False)
    assert info.total_params == 4 and list(info.table["output_shape"]) == ["[-1, 1]"]


def test_frozen_layers_count_as_non_trainable():
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
    for p in net[0].parameters():
        p.requires_grad_(False)
    info = kt.summary(net, input_shape=(4,), print_table=False)
    assert (info.total_params, info.trainable_params, info.non_trainable_params) == (40 + 16 + 18, 34, 40)


def test_keras_model_wrappers_and_float64_nets():
    net = nn.Sequential(nn.Linear(3, 3)).double()
    model = kt.KerasModel(nn.DataParallel(net), loss_fn=nn.MSELoss())
    info = kt.summary(model, input_shape=(3,), print_table=False)  # zeros in the net's dtype
    assert info.total_params == 12
    assert info.params_size_mb == pytest.approx(12 * 8 / 1024**2)
    assert info.table["layer"][0] == "0 (Linear)"


def test_summary_leaves_the_net_as_it_found_it():
    net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    net.train()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    kt.summary(net, input_data=torch.randn(8, 4) * 100, print_table=False)
    assert net.training
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())  # BatchNorm stats untouched
    assert not net[0]._forward_hooks and not net[0]._forward_pre_hooks


def test_beginner_errors_say_what_to_pass():
    net = nn.Embedding(10, 3)
    with pytest.raises(ValueError, match="input_data=.*input_shape="):
        kt.summary(net)
    with pytest.raises(ValueError, match="exactly one of"):
        kt.summary(net, input_data=torch.zeros(1, 2, dtype=torch.long), input_shape=(2,))
    made_from_shape = (
        r"(?s)could not run Embedding on the input made from input_shape.*float32 tensor of shape \[1, 5\]"
    )
    with pytest.raises(RuntimeError, match=made_from_shape + ".*input_data="):
        kt.summary(net, input_shape=(5,))  # zeros are floats; an Embedding needs integer ids
    with pytest.raises(ValueError, match="one sample's shape"):
        kt.summary(net, input_shape=(-1, 5))
    with pytest.raises(TypeError, match=r"a net \(nn.Module\) or a KerasModel; got a str"):
        kt.summary("not a net", input_shape=(5,))


def test_torchkeras_keywords_input_data_args_and_input_dtype():
    from kerastorch.summary import summary  # torchkeras's import path

    class Attention(nn.Module):  # called as net(q, k, v)
        def __init__(self):
            super().__init__()
            self.attention = nn.MultiheadAttention(8, 2, batch_first=True)

        def forward(self, q, k, v):
            return self.attention(q, k, v)[0]

    q = torch.randn(2, 5, 8)
    info = summary(Attention(), input_data_args=(q, q, q), print_table=False)
    assert info.total_params == sum(p.numel() for p in Attention().parameters())
    embedding = nn.Sequential(nn.Embedding(10, 4), nn.Flatten(), nn.Linear(12, 2))  # takes integer ids
    for dtype in (torch.long, torch.LongTensor):
        info = summary(embedding, input_shape=(3,), input_dtype=dtype, print_table=False)
        assert info.total_params == 10 * 4 + 12 * 2 + 2
    with pytest.raises(ValueError, match="not both"):
        summary(Attention(), input_data=q, input_data_args=(q, q, q))
