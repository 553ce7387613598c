"""The book's chapters that show nets with ``summary`` (lyhue1991/eat_pytorch_in_20_days), with
only the import changed: 4-3 (an embedding frozen with ``requires_grad_(False)``, summarised
from ``input_shape=(200,)`` with ``input_dtype=torch.LongTensor``), 5-2 (a GRU and an LSTM by
``input_data``; two ``nn.MultiheadAttention`` by ``input_data_args=(q, k, v)``) and 6-1 (the
same CNN built three ways, each summarised from ``input_shape=(3, 32, 32)``)."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

import kerastorch as torchkeras  # noqa: F401 (the one changed line: "import torchkeras")


def test_4_3_frozen_embedding_by_long_input_shape(capsys):
    class Net(nn.Module):
        def __init__(self):
            super(Net, self).__init__()  # noqa: UP008 (as in the book)

            self.embedding = nn.Embedding(num_embeddings=10000, embedding_dim=3, padding_idx=1)
            self.conv = nn.Sequential()
            self.conv.add_module("conv_1", nn.Conv1d(in_channels=3, out_channels=16, kernel_size=5))
            self.conv.add_module("pool_1", nn.MaxPool1d(kernel_size=2))
            self.conv.add_module("relu_1", nn.ReLU())
            self.conv.add_module("conv_2", nn.Conv1d(in_channels=16, out_channels=128, kernel_size=2))
            self.conv.add_module("pool_2", nn.MaxPool1d(kernel_size=2))
            self.conv.add_module("relu_2", nn.ReLU())

            self.dense = nn.Sequential()
            self.dense.add_module("flatten", nn.Flatten())
            self.dense.add_module("linear", nn.Linear(6144, 1))

        def forward(self, x):
            x = self.embedding(x).transpose(1, 2)
            x = self.conv(x)
            y = self.dense(x)
            return y

    net = Net()
    children_dict = {name: module for name, module in net.named_children()}
    embedding = children_dict["embedding"]
    embedding.requires_grad_(False)  # 冻结其参数

    from kerastorch import summary

    info = summary(net, input_shape=(200,), input_dtype=torch.LongTensor)
    # 不可训练参数数量增加
    printed = capsys.readouterr().out
    assert info.non_trainable_params == embedding.weight.numel()
    assert info.trainable_params == sum(p.numel() for p in net.parameters() if p.requires_grad)
    assert f"Non-trainable params: {info.non_trainable_params:,}" in printed
    assert info.table["output_shape"].iloc[-1] == "[-1, 1]"


def test_5_2_recurrent_layers_and_attention_by_input_data_args():
    inputs = torch.randn(8, 200, 64)  # batch_size, seq_length, features

    gru = nn.GRU(input_size=64, hidden_size=32, num_layers=1, batch_first=True)
    gru_output, gru_hn = gru(inputs)
    lstm = nn.LSTM(input_size=64, hidden_size=32, num_layers=1, batch_first=True)
    lstm_output, (lstm_hn, lstm_cn) = lstm(inputs)

    from kerastorch import summary

    gru_info = summary(gru, input_data=inputs)
    lstm_info = summary(lstm, input_data=inputs)

    # 验证MultiheadAttention和head数量无关
    attention_h8 = nn.MultiheadAttention(embed_dim=64, num_heads=8, bias=True, batch_first=True)
    attention_h16 = nn.MultiheadAttention(embed_dim=64, num_heads=16, bias=True, batch_first=True)
    out_h8 = attention_h8(inputs, inputs, inputs)
    out_h16 = attention_h16(inputs, inputs, inputs)

    from kerastorch import summary

    h8_info = summary(attention_h8, input_data_args=(inputs, inputs, inputs))
    h16_info = summary(attention_h16, input_data_args=(inputs, inputs, inputs))

    # What the chapter shows: the LSTM has 4/3 of the GRU's parameters (9408/12544 is the
    # other way round), and the number of heads does not change the attention's parameters.
    assert gru_info.total_params == sum(p.numel() for p in gru.parameters())
    assert lstm_info.total_params * 3 == gru_info.total_params * 4
    assert h8_info.total_params == h16_info.total_params == sum(p.numel() for p in attention_h8.parameters())
    assert out_h8[0].shape == out_h16[0].shape == inputs.shape
    assert gru_output.shape == lstm_output.shape == (8, 200, 32)


def test_6_1_three_ways_to_build_the_same_net():
    from kerastorch import summary

    class Net(nn.Module):
        def __init__(self):
            super(Net, self).__init__()  # noqa: UP008 (as in the book)
            self.conv1 = nn.Conv2d(in_channels=3, out_channels=32, kernel_size=3)
            self.pool1 = nn.MaxPool2d(kernel_size=2, stride=2)
            self.conv2 = nn.Conv2d(in_channels=32, out_channels=64, kernel_size=5)
            self.pool2 = nn.MaxPool2d(kernel_size=2, stride=2)
            self.dropout = nn.Dropout2d(p=0.1)
            self.adaptive_pool = nn.AdaptiveMaxPool2d((1, 1))
            self.flatten = nn.Flatten()
            self.linear1 = nn.Linear(64, 32)
            self.relu = nn.ReLU()
            self.linear2 = nn.Linear(32, 1)

        def forward(self, x):
            x = self.conv1(x)
            x = self.pool1(x)
            x = self.conv2(x)
            x = self.pool2(x)
            x = self.dropout(x)
            x = self.adaptive_pool(x)
            x = self.flatten(x)
            x = self.linear1(x)
            x = self.relu(x)
            y = self.linear2(x)
            return y

    subclassed = summary(Net(), input_shape=(3, 32, 32))

    net = nn.Sequential(
        OrderedDict(
            [
                ("conv1", nn.Conv2d(in_channels=3, out_channels=32, kernel_size=3)),
                ("pool1", nn.MaxPool2d(kernel_size=2, stride=2)),
                ("conv2", nn.Conv2d(in_channels=32, out_channels=64, kernel_size=5)),
                ("pool2", nn.MaxPool2d(kernel_size=2, stride=2)),
                ("dropout", nn.Dropout2d(p=0.1)),
                ("adaptive_pool", nn.AdaptiveMaxPool2d((1, 1))),
                ("flatten", nn.Flatten()),
                ("linear1", nn.Linear(64, 32)),
                ("relu", nn.ReLU()),
                ("linear2", nn.Linear(32, 1)),
            ]
        )
    )
    sequential = summary(net, input_shape=(3, 32, 32))

    class Net(nn.Module):  # as in the book: the third way, under the same name
        def __init__(self):
            super(Net, self).__init__()  # noqa: UP008 (as in the book)
            self.layers = nn.ModuleList(
                [
                    nn.Conv2d(in_channels=3, out_channels=32, kernel_size=3),
                    nn.MaxPool2d(kernel_size=2, stride=2),
                    nn.Conv2d(in_channels=32, out_channels=64, kernel_size=5),
                    nn.MaxPool2d(kernel_size=2, stride=2),
                    nn.Dropout2d(p=0.1),
                    nn.AdaptiveMaxPool2d((1, 1)),
                    nn.Flatten(),
                    nn.Linear(64, 32),
                    nn.ReLU(),
                    nn.Linear(32, 1),
                ]
            )

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return x

    module_list = summary(Net(), input_shape=(3, 32, 32))

    # What the chapter shows: the same layers, the same output shapes, the same parameters.
    assert subclassed.total_params == sequential.total_params == module_list.total_params
    assert list(subclassed.table["output_shape"]) == list(sequential.table["output_shape"])
    assert list(sequential.table["output_shape"]) == list(module_list.table["output_shape"])
    assert len(sequential.table) == 10
