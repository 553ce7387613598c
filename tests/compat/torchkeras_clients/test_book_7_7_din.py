"""The book's chapter 7-7, "DIN" (lyhue1991/eat_pytorch_in_20_days, ``7-7,DIN网络.ipynb``), with
only the imports changed: the Deep Interest Network (an attention over the user's history of
highly rated movies, with the Dice activation), trained on MovieLens rows that sklearn encoders
and a ``Dataset`` of dicts turn into padded sequences, by torchkeras's ``KerasModel`` running
the chapter's own ``StepRunner`` (``KerasModel.StepRunner = StepRunner``), then checked with
scikit-learn's ``roc_auc_score`` and reloaded from ``torch.save(model.net.state_dict(), ...)``.

Replaced: ``eat_pytorch_datasets/ml_1m/train.csv`` and ``test.csv`` (a download) by generated
files of the same layout, written where the chapter reads them (see ``stand_ins_movielens``),
with fewer rows; 10 epochs instead of 100. Left out: the chapter's first drafts of
``SumPooling``, ``MLP`` and ``Attention``, which it defines again before use.
"""

# The book's code as written: super(Class, self), (object), unused loop variables, if/return True.
# ruff: noqa: UP004, UP008, SIM103, SIM110, B007

from __future__ import annotations

import os
from collections import Counter, OrderedDict

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from sklearn.base import BaseEstimator, TransformerMixin
from stand_ins_movielens import write_ml_1m
from torch import nn

pytestmark = pytest.mark.slow


class MaxPooling(nn.Module):
    def __init__(self, dim):
        super(MaxPooling, self).__init__()
        self.dim = dim

    def forward(self, x):
        return torch.max(x, self.dim)[0]


class SumPooling(nn.Module):
    def __init__(self, dim):
        super(SumPooling, self).__init__()
        self.dim = dim

    def forward(self, x):
        return torch.sum(x, self.dim)


class Dice(nn.Module):
    """
    The Data Adaptive Activation Function in DIN, a generalization of PReLu.
    """

    def __init__(self, emb_size, dim=2, epsilon=1e-8):
        super(Dice, self).__init__()
        assert dim == 2 or dim == 3

        self.bn = nn.BatchNorm1d(emb_size, eps=epsilon)
        self.sigmoid = nn.Sigmoid()
        self.dim = dim

        # wrap alpha in nn.Parameter to make it trainable
        self.alpha = (
            nn.Parameter(torch.zeros((emb_size,))) if self.dim == 2 else nn.Parameter(torch.zeros((emb_size, 1)))
        )

    def forward(self, x):
        assert x.dim() == self.dim
        if self.dim == 2:
            x_p = self.sigmoid(self.bn(x))
            out = self.alpha * (1 - x_p) * x + x_p * x
        else:
            x = torch.transpose(x, 1, 2)
            x_p = self.sigmoid(self.bn(x))
            out = self.alpha * (1 - x_p) * x + x_p * x
            out = torch.transpose(out, 1, 2)
        return out


class Identity(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return x


def get_activation_layer(name, hidden_size=None, dice_dim=2):
    name = name.lower()
    name_dict = {x.lower(): x for x in dir(nn) if "__" not in x and "Z" >= x[0] >= "A"}
    if name == "linear":
        return Identity()
    elif name == "dice":
        assert dice_dim
        return Dice(hidden_size, dice_dim)
    else:
        assert name in name_dict, f"activation type {name} not supported!"
        return getattr(nn, name_dict[name])()


def init_weights(model):
    if isinstance(model, nn.Linear):
        if model.weight is not None:
            nn.init.kaiming_uniform_(model.weight.data)
        if model.bias is not None:
            nn.init.normal_(model.bias.data)
    elif isinstance(model, (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)):
        if model.weight is not None:
            nn.init.normal_(model.weight.data, mean=1, std=0.02)
        if model.bias is not None:
            nn.init.constant_(model.bias.data, 0)
    else:
        pass


class MLP(nn.Module):
    def __init__(self, input_size, hidden_layers, dropout=0.0, batchnorm=True, activation="relu"):
        super(MLP, self).__init__()
        modules = OrderedDict()
        previous_size = input_size
        for index, hidden_layer in enumerate(hidden_layers):
            modules[f"dense{index}"] = nn.Linear(previous_size, hidden_layer)
            if batchnorm:
                modules[f"batchnorm{index}"] = nn.BatchNorm1d(hidden_layer)
            if activation:
                modules[f"activation{index}"] = get_activation_layer(activation, hidden_layer, 2)
            if dropout:
                modules[f"dropout{index}"] = nn.Dropout(dropout)
            previous_size = hidden_layer
        self.mlp = nn.Sequential(modules)

    def forward(self, x):
        return self.mlp(x)


class Attention(nn.Module):
    def __init__(self, input_size, hidden_layers, dropout=0.0, batchnorm=True, activation="prelu", return_scores=False):
        super().__init__()
        self.return_scores = return_scores

        self.mlp = MLP(
            input_size=input_size * 4,
            hidden_layers=hidden_layers,
            dropout=dropout,
            batchnorm=batchnorm,
            activation=activation,
        )
        self.fc = nn.Linear(hidden_layers[-1], 1)

    def forward(self, query, keys, keys_length):
        """
        Parameters
        ----------
        query: 2D tensor, [Batch, Hidden]
        keys: 3D tensor, [Batch, Time, Hidden]
        keys_length: 1D tensor, [Batch]

        Returns
        -------
        outputs: 2D tensor, [Batch, Hidden]
        """

        batch_size, max_length, dim = keys.size()

        query = query.unsqueeze(1).expand(-1, max_length, -1)

        din_all = torch.cat([query, keys, query - keys, query * keys], dim=-1)

        din_all = din_all.view(batch_size * max_length, -1)

        outputs = self.mlp(din_all)

        outputs = self.fc(outputs).view(batch_size, max_length)  # [B, T]

        # Scale
        outputs = outputs / (dim**0.5)

        # Mask
        mask = torch.arange(max_length, device=keys_length.device).repeat(batch_size, 1) < keys_length.view(-1, 1)
        outputs[~mask] = -np.inf

        # Activation
        outputs = torch.sigmoid(outputs)  # [B, T]

        if not self.return_scores:
            # Weighted sum
            outputs = torch.matmul(outputs.unsqueeze(1), keys).squeeze()  # [B, H]

        return outputs


class AttentionGroup(object):
    def __init__(self, name, pairs, hidden_layers, activation="dice", att_dropout=0.0):
        self.name = name
        self.pairs = pairs
        self.hidden_layers = hidden_layers
        self.activation = activation
        self.att_dropout = att_dropout

        self.related_feature_names = set()
        for pair in pairs:
            self.related_feature_names.add(pair["ad"])
            self.related_feature_names.add(pair["pos_hist"])

    def is_attention_feature(self, feature_name):
        if feature_name in self.related_feature_names:
            return True
        return False

    @property
    def pairs_count(self):
        return len(self.pairs)


class DIN(nn.Module):
    def __init__(
        self,
        num_features,
        cat_features,
        seq_features,
        cat_nums,
        embedding_size,
        attention_groups,
        mlp_hidden_layers,
        mlp_activation="prelu",
        mlp_dropout=0.0,
        d_out=1,
    ):
        super().__init__()
        self.num_features = num_features
        self.cat_features = cat_features
        self.seq_features = seq_features
        self.cat_nums = cat_nums
        self.embedding_size = embedding_size

        self.attention_groups = attention_groups

        self.mlp_hidden_layers = mlp_hidden_layers
        self.mlp_activation = mlp_activation
        self.mlp_dropout = mlp_dropout

        self.d_out = d_out

        # embedding
        self.embeddings = OrderedDict()
        for feature in self.cat_features + self.seq_features:
            self.embeddings[feature] = nn.Embedding(self.cat_nums[feature], self.embedding_size, padding_idx=0)
            self.add_module(f"embedding:{feature}", self.embeddings[feature])

        self.sequence_poolings = OrderedDict()
        self.attention_poolings = OrderedDict()
        total_embedding_sizes = 0
        for feature in self.cat_features:
            total_embedding_sizes += self.embedding_size
        for feature in self.seq_features:
            total_embedding_sizes += self.embedding_size

        # sequence_pooling
        for feature in self.seq_features:
            if not self.is_attention_feature(feature):
                self.sequence_poolings[feature] = MaxPooling(1)
                self.add_module(f"pooling:{feature}", self.sequence_poolings[feature])

        # attention_pooling
        for attention_group in self.attention_groups:
            self.attention_poolings[attention_group.name] = self.create_attention_fn(attention_group)
            self.add_module(f"attention_pooling:{attention_group.name}", self.attention_poolings[attention_group.name])

        total_input_size = total_embedding_sizes + len(self.num_features)

        self.mlp = MLP(
            total_input_size, mlp_hidden_layers, dropout=mlp_dropout, batchnorm=True, activation=mlp_activation
        )

        self.final_layer = nn.Linear(mlp_hidden_layers[-1], self.d_out)
        self.apply(init_weights)

    def forward(self, x):
        final_layer_inputs = list()

        number_inputs = list()
        for feature in self.num_features:
            number_inputs.append(x[feature].view(-1, 1))

        embeddings = OrderedDict()
        for feature in self.cat_features:
            embeddings[feature] = self.embeddings[feature](x[feature])

        for feature in self.seq_features:
            if not self.is_attention_feature(feature):
                embeddings[feature] = self.sequence_poolings[feature](self.embeddings[feature](x[feature]))

        for attention_group in self.attention_groups:
            query = torch.cat([embeddings[pair["ad"]] for pair in attention_group.pairs], dim=-1)
            keys = torch.cat(
                [self.embeddings[pair["pos_hist"]](x[pair["pos_hist"]]) for pair in attention_group.pairs], dim=-1
            )
            # hist_length = torch.sum(hist>0,axis=1)
            keys_length = torch.min(
                torch.cat(
                    [torch.sum(x[pair["pos_hist"]] > 0, axis=1).view(-1, 1) for pair in attention_group.pairs], dim=-1
                ),
                dim=-1,
            )[0]

            embeddings[attention_group.name] = self.attention_poolings[attention_group.name](query, keys, keys_length)

        emb_concat = torch.cat(number_inputs + [emb for emb in embeddings.values()], dim=-1)

        final_layer_inputs = self.mlp(emb_concat)
        output = self.final_layer(final_layer_inputs)
        if self.d_out == 1:
            output = output.squeeze()

        return output

    def create_attention_fn(self, attention_group):
        return Attention(
            attention_group.pairs_count * self.embedding_size,
            hidden_layers=attention_group.hidden_layers,
            dropout=attention_group.att_dropout,
            activation=attention_group.activation,
        )

    def is_attention_feature(self, feature):
        for group in self.attention_groups:
            if group.is_attention_feature(feature):
                return True
        return False


# 类别特征预处理
class CategoryEncoder(BaseEstimator, TransformerMixin):
    def __init__(self, min_cnt=5, word2idx=None, idx2word=None):
        super().__init__()
        self.min_cnt = min_cnt
        self.word2idx = word2idx if word2idx else dict()
        self.idx2word = idx2word if idx2word else dict()

    def fit(self, x, y=None):
        if not self.word2idx:
            counter = Counter(np.asarray(x).ravel())

            selected_terms = sorted(list(filter(lambda x: counter[x] >= self.min_cnt, counter)))

            self.word2idx = dict(zip(selected_terms, range(1, len(selected_terms) + 1)))
            self.word2idx["__PAD__"] = 0
            if "__UNKNOWN__" not in self.word2idx:
                self.word2idx["__UNKNOWN__"] = len(self.word2idx)

        if not self.idx2word:
            self.idx2word = {index: word for word, index in self.word2idx.items()}

        return self

    def transform(self, x):
        transformed_x = list()
        for term in np.asarray(x).ravel():
            try:
                transformed_x.append(self.word2idx[term])
            except KeyError:
                transformed_x.append(self.word2idx["__UNKNOWN__"])

        return np.asarray(transformed_x, dtype=np.int64)

    def dimension(self):
        return len(self.word2idx)


# 序列特征预处理（类别序列）
class SequenceEncoder(BaseEstimator, TransformerMixin):
    def __init__(self, sep=" ", min_cnt=5, max_len=None, word2idx=None, idx2word=None):
        super().__init__()
        self.sep = sep
        self.min_cnt = min_cnt
        self.max_len = max_len

        self.word2idx = word2idx if word2idx else dict()
        self.idx2word = idx2word if idx2word else dict()

    def fit(self, x, y=None):
        if not self.word2idx:
            counter = Counter()

            max_len = 0
            for sequence in np.array(x).ravel():
                words = sequence.split(self.sep)
                counter.update(words)
                max_len = max(max_len, len(words))

            if self.max_len is None:
                self.max_len = max_len

            # drop rare words
            words = sorted(list(filter(lambda x: counter[x] >= self.min_cnt, counter)))

            self.word2idx = dict(zip(words, range(1, len(words) + 1)))
            self.word2idx["__PAD__"] = 0
            if "__UNKNOWN__" not in self.word2idx:
                self.word2idx["__UNKNOWN__"] = len(self.word2idx)

        if not self.idx2word:
            self.idx2word = {index: word for word, index in self.word2idx.items()}

        if not self.max_len:
            max_len = 0
            for sequence in np.array(x).ravel():
                words = sequence.split(self.sep)
                max_len = max(max_len, len(words))
            self.max_len = max_len

        return self

    def transform(self, x):
        transformed_x = list()

        for sequence in np.asarray(x).ravel():
            words = list()
            for word in sequence.split(self.sep):
                try:
                    words.append(self.word2idx[word])
                except KeyError:
                    words.append(self.word2idx["__UNKNOWN__"])

            transformed_x.append(np.asarray(words[0 : self.max_len], dtype=np.int64))

        return np.asarray(transformed_x, dtype=object)

    def dimension(self):
        return len(self.word2idx)

    def max_length(self):
        return self.max_len


def test_din_with_the_chapters_step_runner(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    torch.manual_seed(0)
    write_ml_1m()  # the chapter: the two files come with eat_pytorch_datasets (a download)

    from sklearn.impute import SimpleImputer
    from sklearn.pipeline import Pipeline
    from sklearn.preprocessing import QuantileTransformer
    from tqdm import tqdm

    dftrain = pd.read_csv("./eat_pytorch_datasets/ml_1m/train.csv")
    dfval = pd.read_csv("./eat_pytorch_datasets/ml_1m/test.csv")

    for col in ["movieId", "histHighRatedMovieIds", "negHistMovieIds", "genres"]:
        dftrain[col] = dftrain[col].astype(str)
        dfval[col] = dfval[col].astype(str)

    num_features = ["age"]
    cat_features = ["gender", "movieId", "occupation", "zipCode"]
    seq_features = ["genres", "histHighRatedMovieIds", "negHistMovieIds"]

    num_pipe = Pipeline(steps=[("impute", SimpleImputer()), ("quantile", QuantileTransformer())])

    encoders = {}

    print("preprocess number features...")
    dftrain[num_features] = num_pipe.fit_transform(dftrain[num_features]).astype(np.float32)
    dfval[num_features] = num_pipe.transform(dfval[num_features]).astype(np.float32)

    print("preprocess category features...")
    for col in tqdm(cat_features):
        encoders[col] = CategoryEncoder(min_cnt=5)
        dftrain[col] = encoders[col].fit_transform(dftrain[col])
        dfval[col] = encoders[col].transform(dfval[col])

    print("preprocess sequence features...")
    for col in tqdm(seq_features):
        encoders[col] = SequenceEncoder(sep="|", min_cnt=5)
        dftrain[col] = encoders[col].fit_transform(dftrain[col])
        dfval[col] = encoders[col].transform(dfval[col])

    from torch.utils.data import DataLoader, Dataset

    class Df2Dataset(Dataset):
        def __init__(self, dfdata, num_features, cat_features, seq_features, encoders, label_col="label"):
            self.dfdata = dfdata
            self.num_features = num_features
            self.cat_features = cat_features
            self.seq_features = seq_features
            self.encoders = encoders
            self.label_col = label_col
            self.size = len(self.dfdata)

        def __len__(self):
            return self.size

        @staticmethod
        def pad_sequence(sequence, max_length):
            # zero is special index for padding
            padded_seq = np.zeros(max_length, np.int32)
            padded_seq[0 : sequence.shape[0]] = sequence
            return padded_seq

        def __getitem__(self, idx):
            record = OrderedDict()
            for col in self.num_features:
                record[col] = self.dfdata[col].iloc[idx].astype(np.float32)

            for col in self.cat_features:
                record[col] = self.dfdata[col].iloc[idx].astype(np.int64)

            for col in self.seq_features:
                seq = self.dfdata[col].iloc[idx]
                max_length = self.encoders[col].max_length()
                record[col] = Df2Dataset.pad_sequence(seq, max_length)

            if self.label_col is not None:
                record["label"] = self.dfdata[self.label_col].iloc[idx].astype(np.float32)
            return record

        def get_num_batches(self, batch_size):
            return np.ceil(self.size / batch_size)

    ds_train = Df2Dataset(dftrain, num_features, cat_features, seq_features, encoders)
    ds_val = Df2Dataset(dfval, num_features, cat_features, seq_features, encoders)
    dl_train = DataLoader(ds_train, batch_size=128, shuffle=True)
    dl_val = DataLoader(ds_val, batch_size=128, shuffle=False)

    cat_nums = {k: v.dimension() for k, v in encoders.items()}

    for batch in dl_train:  # as in the book: the first batch
        break

    def create_net():
        din_attention_groups = [
            AttentionGroup(
                name="group1",
                pairs=[{"ad": "movieId", "pos_hist": "histHighRatedMovieIds"}],
                activation="dice",
                hidden_layers=[16, 8],
                att_dropout=0.1,
            )
        ]

        net = DIN(
            num_features=num_features,
            cat_features=cat_features,
            seq_features=seq_features,
            cat_nums=cat_nums,
            embedding_size=16,
            attention_groups=din_attention_groups,
            mlp_hidden_layers=[32, 16],
            mlp_activation="prelu",
            mlp_dropout=0.25,
            d_out=1,
        )
        return net

    net = create_net()

    out = net.forward(batch)

    from kerastorch.summary import summary  # upstream: from torchkeras.summary import summary

    summary(net, input_data=batch)
    printed_summary = capsys.readouterr().out

    from kerastorch import KerasModel  # upstream: from torchkeras import KerasModel

    class StepRunner:
        def __init__(
            self, net, loss_fn, accelerator=None, stage="train", metrics_dict=None, optimizer=None, lr_scheduler=None
        ):
            self.net, self.loss_fn, self.metrics_dict, self.stage = net, loss_fn, metrics_dict, stage
            self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
            self.accelerator = accelerator
            if self.stage == "train":
                self.net.train()
            else:
                self.net.eval()

        def __call__(self, batch):
            # loss
            with self.accelerator.autocast():
                # loss
                preds = self.net(batch)
                labels = batch["label"]
                loss = self.loss_fn(preds, labels)

            # backward()
            if self.stage == "train" and self.optimizer is not None:
                self.accelerator.backward(loss)
                if self.accelerator.sync_gradients:
                    self.accelerator.clip_grad_norm_(self.net.parameters(), 1.0)
                self.optimizer.step()
                if self.lr_scheduler is not None:
                    self.lr_scheduler.step()
                self.optimizer.zero_grad()

            all_loss = self.accelerator.gather(loss).sum()
            all_preds = self.accelerator.gather(preds)
            all_labels = self.accelerator.gather(labels)

            # losses (or plain metrics that can be averaged)
            step_losses = {self.stage + "_loss": all_loss.item()}

            # metrics (stateful metrics)
            step_metrics = {
                self.stage + "_" + name: metric_fn(all_preds, all_labels).item()
                for name, metric_fn in self.metrics_dict.items()
            }

            if self.stage == "train":
                if self.optimizer is not None:
                    step_metrics["lr"] = self.optimizer.state_dict()["param_groups"][0]["lr"]
                else:
                    step_metrics["lr"] = 0.0
            return step_losses, step_metrics

    monkeypatch.setattr(KerasModel, "StepRunner", StepRunner)  # upstream: KerasModel.StepRunner = StepRunner

    from kerastorch.metrics import AUC  # upstream: from torchkeras.metrics import AUC

    loss_fn = nn.BCEWithLogitsLoss()

    metrics_dict = {"auc": AUC()}
    optimizer = torch.optim.Adam(net.parameters(), lr=0.002, weight_decay=0.001)

    model = KerasModel(
        net,
        loss_fn=loss_fn,
        metrics_dict=metrics_dict,
        optimizer=optimizer,
    )

    dfhistory = model.fit(
        train_data=dl_train,
        val_data=dl_val,
        epochs=10,  # upstream: 100
        ckpt_path="checkpoint",
        patience=10,
        monitor="val_auc",
        mode="max",
        plot=True,
        cpu=True,
    )

    evaluated = model.evaluate(dl_val)

    from sklearn.metrics import roc_auc_score

    model.eval()
    dl_val = model.accelerator.prepare(dl_val)
    with torch.no_grad():
        result = torch.cat([model.forward(t) for t in dl_val])

    preds = F.sigmoid(result)
    labels = torch.cat([x["label"] for x in dl_val])

    val_auc = roc_auc_score(labels.numpy(), preds.numpy())
    print(val_auc)

    torch.save(model.net.state_dict(), "best_din.pt")
    net_clone = create_net()
    net_clone.load_state_dict(torch.load("best_din.pt"))

    net_clone.eval()
    labels = torch.tensor([x["label"] for x in ds_val])
    preds = torch.cat([net_clone(x).data for x in dl_val])
    val_auc_clone = roc_auc_score(labels.cpu().numpy(), preds.cpu().numpy())  # upstream: val_auc = ...
    print(val_auc_clone)

    # What the chapter relies on. The data: upstream's encoders and Dataset made padded int
    # sequences of the files' lengths (10 movies, up to 6 genres) and a net that runs on them.
    assert batch["histHighRatedMovieIds"].shape == (128, 10) and batch["genres"].shape[1] <= 6
    assert batch["histHighRatedMovieIds"].dtype == torch.int32 and batch["label"].dtype == torch.float32
    assert out.shape == (128,)
    # summary's table of the net called on one dict, Dice in it, every parameter counted once.
    assert "(Embedding)" in printed_summary and "(Dice)" in printed_summary
    assert f"Total params: {sum(p.numel() for p in net.parameters()):,}" in printed_summary
    # fit ran the chapter's StepRunner (without it, fit's own step calls net(**batch) on these
    # dict batches, which DIN does not take): the history's columns are what the runner
    # returns, its "lr" included, one row per epoch (patience 10 never stops 10 epochs).
    assert isinstance(dfhistory, pd.DataFrame) and len(dfhistory) == 10
    assert set(dfhistory.columns) == {"epoch", "train_loss", "train_auc", "lr", "val_loss", "val_auc"}
    assert (dfhistory["lr"] == 0.002).all()
    # The net learned the signal (chance is 0.5), and the loss fell.
    best = dfhistory["val_auc"].idxmax()
    assert dfhistory["val_auc"][best] > 0.65 and dfhistory["val_auc"][best] > dfhistory["val_auc"].iloc[0] + 0.05
    assert dfhistory["train_loss"].iloc[-1] < dfhistory["train_loss"].iloc[0]
    # The best epoch's weights are back (val_auc is monitored, mode max): evaluate (the runner
    # again) and scikit-learn on the net's outputs agree with the history's best epoch.
    assert set(evaluated) == {"val_loss", "val_auc"}
    assert evaluated["val_auc"] == pytest.approx(dfhistory["val_auc"][best], abs=1e-6)
    assert evaluated["val_loss"] == pytest.approx(dfhistory["val_loss"][best], rel=1e-5)
    assert val_auc == pytest.approx(dfhistory["val_auc"][best], abs=1e-6)
    # val_loss is the runner's loss, loss_fn(preds, labels), averaged over the samples.
    with torch.no_grad():
        losses = [loss_fn(model.net(b), b["label"]).item() * len(b["label"]) for b in dl_val]
    assert evaluated["val_loss"] == pytest.approx(sum(losses) / len(ds_val), rel=1e-5)
    # The reloaded state dict scores the same; the checkpoint at ckpt_path is those weights.
    assert val_auc_clone == pytest.approx(val_auc, abs=1e-9)
    assert os.path.isfile("checkpoint")
    from_checkpoint = create_net()
    from_checkpoint.load_state_dict(torch.load("checkpoint", weights_only=True))
    from_checkpoint.eval()
    with torch.no_grad():
        assert torch.allclose(torch.cat([from_checkpoint(x) for x in dl_val]), result)
    assert f"{val_auc}\n{val_auc_clone}\n" in capsys.readouterr().out
