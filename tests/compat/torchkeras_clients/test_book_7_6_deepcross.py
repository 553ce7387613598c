"""The book's chapter 7-6, "DeepCross" (lyhue1991/eat_pytorch_in_20_days, ``7-6,DeepCross模型.ipynb``),
with only the import changed: DCN-v2 (``cross_type="matrix"``, stacked) on numerical columns and
categorical embeddings of size sqrt(categories), the net taking one tuple ``(x_num, x_cat)``,
trained with ``torchkeras.metrics.AUC`` and reloaded with
``net_clone.load_state_dict(torch.load(model.ckpt_path))``. Criteo's sample (``criteo_small.zip``,
a download) is replaced by a generated table of the same layout (``stand_ins_criteo.py``, which
also holds the ``DfDataset`` that the chapter defines as 7-3 does); fewer rows and epochs (100
there, 10 here). The cells that define the three cross layers on their own, before the cell that
defines them again with the whole net, are left out."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from stand_ins_criteo import DfDataset, criteo_like_table
from torch import nn

import kerastorch as torchkeras  # noqa: F401 (the one changed line: "import torchkeras"; not used after, as in the book)

pytestmark = pytest.mark.slow


# 离散特征编码
class CatEmbeddingSqrt(nn.Module):
    """
    离散特征使用Embedding层编码, d_embed等于sqrt(category)
    输入shape: [batch_size,d_in],
    输出shape: [batch_size,d_out]
    """

    def __init__(self, categories, d_embed_max=100):
        super().__init__()
        self.categories = categories
        self.d_embed_list = [min(max(int(x**0.5), 2), d_embed_max) for x in categories]
        self.embedding_list = nn.ModuleList(
            [nn.Embedding(self.categories[i], self.d_embed_list[i]) for i in range(len(categories))]
        )
        self.d_cat_sum = sum(self.d_embed_list)

    def forward(self, x_cat):
        """
        param x_cat: Long tensor of size ``(batch_size, d_in)``
        """
        x_out = torch.cat([self.embedding_list[i](x_cat[:, i]) for i in range(len(self.categories))], dim=1)
        return x_out


# deep部分
class MLP(nn.Module):
    def __init__(self, d_in, d_layers, dropout):
        super().__init__()
        layers = []
        for d in d_layers:
            layers.append(nn.Linear(d_in, d))
            layers.append(nn.BatchNorm1d(d))
            layers.append(nn.ReLU())
            layers.append(nn.Dropout(p=dropout))
            d_in = d
        self.mlp = nn.Sequential(*layers)

    def forward(self, x):
        return self.mlp(x)


# 3种CrossNet的实现
class CrossNetVector(nn.Module):
    def __init__(self, d_in, n_cross=2):
        super().__init__()
        self.n_cross = n_cross
        self.linears = nn.ModuleList([nn.Linear(d_in, 1, bias=False) for i in range(self.n_cross)])
        self.biases = nn.ParameterList([nn.Parameter(torch.zeros(d_in)) for i in range(self.n_cross)])

    def forward(self, x):
        x0 = x
        xi = x
        for i in range(self.n_cross):
            xi = x0 * self.linears[i](xi) + self.biases[i] + xi
        return xi


class CrossNetMatrix(nn.Module):
    def __init__(self, d_in, n_cross=2):
        super().__init__()
        self.n_cross = n_cross
        self.linears = nn.ModuleList([nn.Linear(d_in, d_in) for i in range(self.n_cross)])

    def forward(self, x):
        x0 = x
        xi = x
        for i in range(self.n_cross):
            xi = x0 * self.linears[i](xi) + xi
        return xi


class CrossNetMix(nn.Module):
    def __init__(self, d_in, n_cross=2, low_rank=32, n_experts=4):
        super().__init__()
        self.d_in = d_in
        self.n_cross = n_cross
        self.low_rank = low_rank
        self.n_experts = n_experts

        # U: (d_in, low_rank)
        self.U_list = nn.ParameterList(
            [nn.Parameter(nn.init.xavier_normal_(torch.empty(n_experts, d_in, low_rank))) for i in range(self.n_cross)]
        )

        # V: (d_in, low_rank)
        self.V_list = nn.ParameterList(
            [nn.Parameter(nn.init.xavier_normal_(torch.empty(n_experts, d_in, low_rank))) for i in range(self.n_cross)]
        )

        # C: (low_rank, low_rank)
        self.C_list = nn.ParameterList(
            [
                nn.Parameter(nn.init.xavier_normal_(torch.empty(n_experts, low_rank, low_rank)))
                for i in range(self.n_cross)
            ]
        )

        # G: (d_in, 1)
        self.gating = nn.ModuleList([nn.Linear(d_in, 1, bias=False) for i in range(self.n_experts)])

        # Bias
        self.biases = nn.ParameterList([nn.Parameter(torch.zeros(d_in)) for i in range(self.n_cross)])

    def forward(self, x):
        x0 = x
        xi = x
        for i in range(self.n_cross):
            output_of_experts = []
            gating_score_of_experts = []
            for expert_id in range(self.n_experts):
                # (1) G(xi)
                # compute the gating score by xi
                gating_score_of_experts.append(self.gating[expert_id](xi))

                # (2) E(xi)
                # project the input xi to low_rank space
                v_x = xi @ (self.V_list[i][expert_id])  # (batch_size, low_rank)

                # nonlinear activation in low rank space
                v_x = torch.tanh(v_x)
                v_x = v_x @ self.C_list[i][expert_id]  # (batch_size, low_rank)
                v_x = torch.tanh(v_x)

                # project back to d_in space
                uv_x = v_x @ (self.U_list[i][expert_id].T)  # (batch_size, d_in)
                expert_out = x0 * (uv_x + self.biases[i])
                output_of_experts.append(expert_out)

            # (3) mixture of low-rank experts
            output_of_experts = torch.stack(output_of_experts, 2)  # (batch_size, d_in, n_experts)
            gating_score_of_experts = torch.stack(gating_score_of_experts, 1)  # (batch_size, n_experts, 1)
            moe_out = torch.bmm(output_of_experts, gating_score_of_experts.softmax(1))
            xi = torch.squeeze(moe_out) + xi  # (batch_size, d_in)

        return xi


class DeepCross(nn.Module):
    """
    DeepCross三种模型(DCN-vec,DCN-matrix,DCN-mix)的统一实现。
    """

    def __init__(
        self,
        d_numerical,
        categories,
        d_embed_max=8,
        n_cross=2,
        cross_type="matrix",
        low_rank=32,
        n_experts=4,
        mlp_layers=[128, 64, 32],  # noqa: B006 (as in the book; never changed)
        mlp_dropout=0.25,
        stacked=True,
        n_classes=1,
    ):
        super().__init__()

        if cross_type == "mix":
            assert low_rank is not None and n_experts is not None

        if d_numerical is None:
            d_numerical = 0
        if categories is None:
            categories = []

        self.categories = categories
        self.n_classes = n_classes
        self.stacked = stacked

        self.cat_embedding = CatEmbeddingSqrt(categories, d_embed_max) if categories else None

        self.d_in = d_numerical
        if self.cat_embedding:
            self.d_in += self.cat_embedding.d_cat_sum

        if cross_type == "vector":
            self.cross_layer = CrossNetVector(self.d_in, n_cross)
        elif cross_type == "matrix":
            self.cross_layer = CrossNetMatrix(self.d_in, n_cross)
        elif cross_type == "mix":
            self.cross_layer = CrossNetMix(self.d_in, n_cross, low_rank, n_experts)
        else:
            raise NotImplementedError("cross_type should  be one of ('vector','matrix','mix') !")

        self.mlp = MLP(d_in=self.d_in, d_layers=mlp_layers, dropout=mlp_dropout)

        if self.stacked:
            self.last_linear = nn.Linear(mlp_layers[-1], n_classes)
        else:
            self.last_linear = nn.Linear(self.d_in + mlp_layers[-1], n_classes)

    def forward(self, x):
        """
        x_num: numerical features
        x_cat: category features
        """
        x_num, x_cat = x

        # embedding
        x_total = []
        if x_num is not None:
            x_total.append(x_num)
        if self.cat_embedding is not None:
            x_total.append(self.cat_embedding(x_cat))
        x_total = torch.cat(x_total, dim=-1)

        # cross部分
        x_cross = self.cross_layer(x_total)

        # deep部分
        if self.stacked:
            x_deep = self.mlp(x_cross)
            x_out = self.last_linear(x_deep)
        else:
            x_deep = self.mlp(x_total)
            x_deep_cross = torch.cat([x_deep, x_cross], axis=1)
            x_out = self.last_linear(x_deep_cross)

        if self.n_classes == 1:
            x_out = x_out.squeeze(-1)

        return x_out


def test_deepcross_on_a_tuple_input(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    np.random.seed(0)  # the book's train_test_split(...) without random_state draws from numpy's global state

    ##测试 DeepCross

    x_num = torch.randn(2, 3)
    x_cat = torch.randint(0, 2, (2, 3))

    dcn_vec = DeepCross(
        d_numerical=3,
        categories=[4, 3, 2],
        d_embed_max=4,
        n_cross=2,
        cross_type="vector",
        mlp_layers=[20, 20],
        mlp_dropout=0.25,
        stacked=False,
        n_classes=1,
    )

    dcn_matrix = DeepCross(
        d_numerical=3,
        categories=[4, 3, 2],
        d_embed_max=4,
        n_cross=2,
        cross_type="matrix",
        mlp_layers=[20, 20],
        mlp_dropout=0.25,
        stacked=True,
        n_classes=1,
    )

    dcn_mix = DeepCross(
        d_numerical=3,
        categories=[4, 3, 2],
        d_embed_max=4,
        n_cross=2,
        cross_type="mix",
        low_rank=32,
        n_experts=4,
        mlp_layers=[20, 20],
        mlp_dropout=0.25,
        stacked=False,
        n_classes=1,
    )

    print(dcn_vec((x_num, x_cat)))
    print(dcn_matrix((x_num, x_cat)))
    print(dcn_mix((x_num, x_cat)))

    from sklearn.impute import SimpleImputer
    from sklearn.model_selection import train_test_split
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import LabelEncoder, QuantileTransformer
    from torch.utils.data import DataLoader

    dfdata = criteo_like_table(rows=40000)  # the book: pd.read_csv("./eat_pytorch_datasets/criteo_small.zip", ...)
    # (about a million rows there; 40000 here: 13 steps an epoch, enough to learn in 10 epochs)
    dfdata.columns = ["label"] + ["I" + str(x) for x in range(1, 14)] + ["C" + str(x) for x in range(14, 40)]

    cat_cols = [x for x in dfdata.columns if x.startswith("C")]
    num_cols = [x for x in dfdata.columns if x.startswith("I")]
    num_pipe = Pipeline(steps=[("impute", SimpleImputer()), ("quantile", QuantileTransformer())])

    for col in cat_cols:
        dfdata[col] = LabelEncoder().fit_transform(dfdata[col])

    dfdata[num_cols] = num_pipe.fit_transform(dfdata[num_cols])

    categories = [dfdata[col].max() + 1 for col in cat_cols]

    # class DfDataset(Dataset): the book's, imported from stand_ins_criteo
    dftrain_val, dftest = train_test_split(dfdata, test_size=0.2)
    dftrain, dfval = train_test_split(dftrain_val, test_size=0.2)

    ds_train = DfDataset(
        dftrain,
        label_col="label",
        num_features=num_cols,
        cat_features=cat_cols,
        categories=categories,
        is_training=True,
    )

    ds_val = DfDataset(
        dfval, label_col="label", num_features=num_cols, cat_features=cat_cols, categories=categories, is_training=True
    )

    ds_test = DfDataset(
        dftest, label_col="label", num_features=num_cols, cat_features=cat_cols, categories=categories, is_training=True
    )

    dl_train = DataLoader(ds_train, batch_size=2048, shuffle=True)
    dl_val = DataLoader(ds_val, batch_size=2048, shuffle=False)
    dl_test = DataLoader(ds_test, batch_size=2048, shuffle=False)

    for features, labels in dl_train:  # noqa: B007 (as in the book: the first batch)
        break

    # 此处我们选择的交叉模块是CrossNetMatrix, 也就是构建的DCNV2模型
    # 读者也可以尝试CrossNetVector和CrossNetMix
    def create_net():
        net = DeepCross(
            d_numerical=ds_train.X_num.shape[1],
            categories=ds_train.get_categories(),
            d_embed_max=8,
            n_cross=2,
            cross_type="matrix",
            mlp_layers=[128, 64, 32],
            mlp_dropout=0.25,
            stacked=True,
            n_classes=1,
        )
        return net

    from kerastorch import summary  # noqa: F401 (imported and not called, as in the book)

    net = create_net()

    from kerastorch import KerasModel
    from kerastorch.metrics import AUC

    loss_fn = nn.BCEWithLogitsLoss()

    metrics_dict = {"auc": AUC()}

    optimizer = torch.optim.Adam(net.parameters(), lr=0.002, weight_decay=0.001)

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
    print(val_auc)

    net_clone = create_net()
    net_clone.load_state_dict(torch.load(model.ckpt_path))

    # What the chapter relies on: val_auc in the history (one row per epoch), evaluate's keys,
    # AUC the same as scikit-learn's on the same predictions (exact, not binned), a net that
    # learned, and the checkpoint at model.ckpt_path a plain state dict that gives back the
    # best epoch's net (BatchNorm's running statistics included), the one fit left in the model.
    assert {"train_loss", "train_auc", "val_loss", "val_auc"} <= set(dfhistory.columns)
    assert list(dfhistory["epoch"]) == list(range(1, len(dfhistory) + 1))
    assert set(evaluated) == {"val_loss", "val_auc"}
    assert evaluated["val_auc"] == pytest.approx(val_auc, abs=1e-6)
    assert val_auc > 0.8
    assert dfhistory["train_loss"].iloc[-1] < dfhistory["train_loss"].iloc[0] - 0.05
    assert model.ckpt_path == "checkpoint" and model.mode == "max" and model.monitor == "val_auc"
    net_clone.eval()
    with torch.no_grad():
        reloaded = torch.cat([net_clone.forward(t[0]) for t in dl_test])
        reloaded_val = torch.cat([net_clone.forward(t[0]) for t in dl_val])
    assert torch.allclose(reloaded, result)
    assert roc_auc_score(ds_val.Y.numpy(), reloaded_val.numpy()) == pytest.approx(dfhistory["val_auc"].max(), abs=1e-6)
