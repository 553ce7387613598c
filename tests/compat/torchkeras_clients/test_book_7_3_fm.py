"""The book's chapter 7-3, "FM" (lyhue1991/eat_pytorch_in_20_days), with only the import changed:
a factorization machine whose net takes one tuple ``(x_num, x_cat)`` as its single input,
trained with ``torchkeras.metrics.AUC`` on float labels and reloaded with
``net_clone.load_state_dict(torch.load(model.ckpt_path))``. Criteo's sample
(``criteo_small.zip``, a download) is replaced by a generated table of the same layout: a
label, 13 numerical columns with gaps and 26 categorical columns of hashed strings; fewer rows
and epochs (100 there, 10 here). The layers and ``DfDataset`` that the chapters 7-3 to 7-6 define
the same way are imported, as the book writes them, from ``stand_ins_criteo.py``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from stand_ins_criteo import CatEmbedding, CatLinear, DfDataset, FMLayer, NumEmbedding, criteo_like_table
from torch import nn

import kerastorch as torchkeras  # the one changed line: "import torchkeras"

pytestmark = pytest.mark.slow


class FM(nn.Module):
    """
    完整FM模型。
    """

    def __init__(self, d_numerical, categories=None, d_embed=4, n_classes=1):
        super().__init__()
        if d_numerical is None:
            d_numerical = 0
        if categories is None:
            categories = []
        self.categories = categories
        self.n_classes = n_classes

        self.num_linear = nn.Linear(d_numerical, n_classes) if d_numerical else None
        self.cat_linear = CatLinear(categories, n_classes) if categories else None

        self.num_embedding = NumEmbedding(d_numerical, 1, d_embed) if d_numerical else None
        self.cat_embedding = CatEmbedding(categories, d_embed) if categories else None

        if n_classes == 1:
            self.fm = FMLayer(reduce_sum=True)
            self.fm_linear = None
        else:
            assert n_classes >= 2
            self.fm = FMLayer(reduce_sum=False)
            self.fm_linear = nn.Linear(d_embed, n_classes)

    def forward(self, x):
        """
        x_num: numerical features
        x_cat: category features
        """
        x_num, x_cat = x
        # linear部分
        x = 0.0
        if self.num_linear:
            x = x + self.num_linear(x_num)
        if self.cat_linear:
            x = x + self.cat_linear(x_cat)

        # 交叉项部分
        x_embedding = []
        if self.num_embedding:
            x_embedding.append(self.num_embedding(x_num[..., None]))
        if self.cat_embedding:
            x_embedding.append(self.cat_embedding(x_cat))
        x_embedding = torch.cat(x_embedding, dim=1)

        if self.n_classes == 1:
            x = x + self.fm(x_embedding)
            x = x.squeeze(-1)
        else:
            x = x + self.fm_linear(self.fm(x_embedding))
        return x


def test_fm_on_a_tuple_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    print("torchkeras.__version__=" + torchkeras.__version__)
    from sklearn.impute import SimpleImputer
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import LabelEncoder, QuantileTransformer
    from torch.utils.data import DataLoader

    dfdata = criteo_like_table()  # the book: pd.read_csv("./eat_pytorch_datasets/criteo_small.zip", ...)
    dfdata.columns = ["label"] + ["I" + str(x) for x in range(1, 14)] + ["C" + str(x) for x in range(14, 40)]

    cat_cols = [x for x in dfdata.columns if x.startswith("C")]
    num_cols = [x for x in dfdata.columns if x.startswith("I")]
    num_pipe = Pipeline(steps=[("impute", SimpleImputer()), ("quantile", QuantileTransformer(n_quantiles=1000))])

    for col in cat_cols:
        dfdata[col] = LabelEncoder().fit_transform(dfdata[col])

    dfdata[num_cols] = num_pipe.fit_transform(dfdata[num_cols])

    categories = [dfdata[col].max() + 1 for col in cat_cols]

    # class DfDataset(Dataset): the book's, imported from stand_ins_criteo
    dftrain_val, dftest = train_test_split(dfdata, test_size=0.2, random_state=0)
    dftrain, dfval = train_test_split(dftrain_val, test_size=0.2, random_state=0)

    ds_train = DfDataset(
        dftrain, label_col="label", num_features=num_cols, cat_features=cat_cols, categories=categories
    )
    ds_val = DfDataset(dfval, label_col="label", num_features=num_cols, cat_features=cat_cols, categories=categories)
    ds_test = DfDataset(dftest, label_col="label", num_features=num_cols, cat_features=cat_cols, categories=categories)

    dl_train = DataLoader(ds_train, batch_size=2048, shuffle=True)
    dl_val = DataLoader(ds_val, batch_size=2048, shuffle=False)
    dl_test = DataLoader(ds_test, batch_size=2048, shuffle=False)

    for features, labels in dl_train:  # noqa: B007 (as in the book: the first batch)
        break

    def create_net():
        net = FM(d_numerical=ds_train.X_num.shape[1], categories=ds_train.get_categories(), d_embed=8, n_classes=1)
        return net

    from kerastorch import summary

    net = create_net()
    summary(net, input_data=features)

    from kerastorch import KerasModel
    from kerastorch.metrics import AUC

    net = create_net()
    loss_fn = nn.BCEWithLogitsLoss()
    metrics_dict = {"auc": AUC()}
    optimizer = torch.optim.Adam(net.parameters(), lr=0.005, weight_decay=0.001)
    model = KerasModel(net, loss_fn=loss_fn, metrics_dict=metrics_dict, optimizer=optimizer)

    dfhistory = model.fit(
        train_data=dl_train,
        val_data=dl_val,
        epochs=10,  # the book: 100
        ckpt_path="checkpoint",
        patience=5,
        monitor="val_auc",
        mode="max",
        plot=True,
        cpu=True,
    )

    evaluated = model.evaluate(dl_test)

    from sklearn.metrics import roc_auc_score

    model.eval()
    dl_test = model.accelerator.prepare(dl_test)
    with torch.no_grad():
        result = torch.cat([model.forward(t[0]) for t in dl_test])

    preds = F.sigmoid(result)
    labels = torch.cat([x[-1] for x in dl_test])

    val_auc = roc_auc_score(labels.numpy(), preds.numpy())

    net_clone = create_net()
    net_clone.load_state_dict(torch.load(model.ckpt_path))

    # What the chapter relies on: val_auc in the history, evaluate's keys, AUC the same as
    # scikit-learn's on the same predictions (exact, not binned), and the checkpoint at
    # model.ckpt_path a plain state dict that gives back the best epoch's predictions.
    assert {"train_loss", "train_auc", "val_loss", "val_auc"} <= set(dfhistory.columns)
    assert set(evaluated) == {"val_loss", "val_auc"}
    assert evaluated["val_auc"] == pytest.approx(val_auc, abs=1e-6)
    assert dfhistory["val_auc"].max() > dfhistory["val_auc"].iloc[0] + 0.05
    assert model.ckpt_path == "checkpoint" and model.mode == "max" and model.monitor == "val_auc"
    with torch.no_grad():
        reloaded = torch.cat([net_clone.forward(t[0]) for t in dl_test])
    assert torch.allclose(reloaded, result)
