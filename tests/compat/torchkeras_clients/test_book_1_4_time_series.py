"""The book's chapter 1-4, "time series" (lyhue1991/eat_pytorch_in_20_days), with only the
import changed: an LSTM that reads 8 days of new COVID-19 cases, deaths and recoveries and
predicts the next day, trained with a loss function of its own, a torchmetrics metric and a
StepLR scheduler. The book's ``covid-19.csv`` is replaced by a generated table of the same
columns and length (46 days after differencing); the plots are left out, and the last cell's
``model.load_ckpt`` (a name the chapter never defined) reads ``keras_model.load_ckpt``."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import kerastorch as torchkeras  # noqa: F401 (the one changed line: "import torchkeras")

pytestmark = pytest.mark.slow


def covid_like_table() -> pd.DataFrame:
    """Cumulative counts over 47 days with the book's columns, growing then levelling off."""
    rng = np.random.default_rng(0)
    days = np.arange(47)
    new_confirmed = 3000 * np.exp(-(((days - 15) / 8.0) ** 2)) + rng.integers(0, 200, 47)
    new_cured = 2000 * np.exp(-(((days - 30) / 10.0) ** 2)) + rng.integers(0, 100, 47)
    new_dead = 0.04 * new_confirmed + rng.integers(0, 10, 47)
    return pd.DataFrame(
        {
            "date": pd.date_range("2020-01-20", periods=47).strftime("%Y%m%d"),
            "confirmed_num": np.cumsum(new_confirmed).astype(int),
            "cured_num": np.cumsum(new_cured).astype(int),
            "dead_num": np.cumsum(new_dead).astype(int),
        }
    )


def test_covid_lstm(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    df = covid_like_table()  # the book: pd.read_csv("./eat_pytorch_datasets/covid-19.csv", sep="\t")

    dfdata = df.set_index("date")
    dfdiff = dfdata.diff(periods=1).dropna()
    dfdiff = dfdiff.reset_index("date")
    dfdiff = dfdiff.drop("date", axis=1).astype("float32")

    from torch import nn
    from torch.utils.data import DataLoader, Dataset

    # 用某日前8天窗口数据作为输入预测该日数据
    WINDOW_SIZE = 8

    class Covid19Dataset(Dataset):
        def __len__(self):
            return len(dfdiff) - WINDOW_SIZE

        def __getitem__(self, i):
            x = dfdiff.loc[i : i + WINDOW_SIZE - 1, :]
            feature = torch.tensor(x.values)
            y = dfdiff.loc[i + WINDOW_SIZE, :]
            label = torch.tensor(y.values)
            return (feature, label)

    ds_train = Covid19Dataset()
    # 数据较小，可以将全部训练数据放入到一个batch中，提升性能
    dl_train = DataLoader(ds_train, batch_size=38)
    for features, labels in dl_train:  # noqa: B007 (as in the book: the first batch)
        break
    # dl_train同时作为验证集
    dl_val = dl_train

    class Block(nn.Module):
        def __init__(self):
            super(Block, self).__init__()  # noqa: UP008 (as in the book)

        def forward(self, x, x_input):
            x_out = torch.max((1 + x) * x_input[:, -1, :], torch.tensor(0.0))
            return x_out

    class Net(nn.Module):
        def __init__(self):
            super(Net, self).__init__()  # noqa: UP008 (as in the book)
            # 3层lstm
            self.lstm = nn.LSTM(input_size=3, hidden_size=3, num_layers=5, batch_first=True)
            self.linear = nn.Linear(3, 3)
            self.block = Block()

        def forward(self, x_input):
            x = self.lstm(x_input)[0][:, -1, :]
            x = self.linear(x)
            y = self.block(x, x_input)
            return y

    net = Net()

    from kerastorch import summary

    summary(net, input_data=features)

    from torchmetrics.regression import MeanAbsolutePercentageError

    def mspe(y_pred, y_true):
        err_percent = (y_true - y_pred) ** 2 / (torch.max(y_true**2, torch.tensor(1e-7)))
        return torch.mean(err_percent)

    net = Net()
    loss_fn = mspe
    metric_dict = {"mape": MeanAbsolutePercentageError()}
    optimizer = torch.optim.Adam(net.parameters(), lr=0.01)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.0001)

    from kerastorch import KerasModel

    keras_model = KerasModel(
        net, loss_fn=loss_fn, metrics_dict=metric_dict, optimizer=optimizer, lr_scheduler=lr_scheduler
    )

    dfhistory = keras_model.fit(
        train_data=dl_train,
        val_data=dl_val,
        epochs=15,  # the book: 100
        ckpt_path="checkpoint",
        patience=10,
        monitor="val_loss",
        mode="min",
        callbacks=None,
        plot=True,
        cpu=True,
    )

    evaluated = keras_model.evaluate(dl_val)

    # 使用dfresult记录现有数据以及此后预测的疫情数据
    dfresult = dfdiff[["confirmed_num", "cured_num", "dead_num"]].copy()
    # 预测此后1000天的新增走势,将其结果添加到dfresult中 (here 20 days)
    for i in range(20):  # noqa: B007 (as in the book)
        arr_input = torch.unsqueeze(torch.from_numpy(dfresult.values[-38:, :]), axis=0)
        arr_predict = keras_model.forward(arr_input)
        dfpredict = pd.DataFrame(torch.floor(arr_predict).data.numpy(), columns=dfresult.columns)
        dfresult = pd.concat([dfresult, dfpredict], ignore_index=True)

    # 可以加载权重
    keras_model.load_ckpt("checkpoint")

    # What the chapter relies on: its history columns, evaluate's keys, the forward pass on
    # the model predicting whole days, and the checkpoint reloading to the best epoch's score.
    assert {"epoch", "train_loss", "train_mape", "val_loss", "val_mape", "lr"} <= set(dfhistory.columns)
    assert set(evaluated) == {"val_loss", "val_mape"}
    assert evaluated["val_loss"] == pytest.approx(dfhistory["val_loss"].min(), rel=1e-5)
    assert dfhistory["val_loss"].min() < dfhistory["val_loss"].iloc[0]
    # StepLR(step_size=10) stepped once per epoch, as the book meant it.
    assert dfhistory["lr"].iloc[0] == pytest.approx(0.01)
    assert len(dfhistory) > 10 and dfhistory["lr"].iloc[10] == pytest.approx(0.01 * 0.0001)
    assert len(dfresult) == len(dfdiff) + 20
    assert (dfresult.values[-20:] >= 0).all()
    assert keras_model.evaluate(dl_val)["val_loss"] == pytest.approx(evaluated["val_loss"], rel=1e-5)
