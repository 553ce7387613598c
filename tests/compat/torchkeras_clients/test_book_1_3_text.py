"""The book's chapter 1-3, "text data" (lyhue1991/eat_pytorch_in_20_days,
``1-3,文本数据建模流程范例.ipynb``), with only the import changed: IMDB reviews cut into words,
coded with a gensim ``Dictionary`` into 200 ``int32`` ids per review, and a 1-D CNN over an
``nn.Embedding`` with ``padding_idx=0``, shown with ``torchkeras.summary(net, input_data=features)``
and trained with BCE on ``float`` labels of shape ``(1,)`` and torchmetrics' binary ``Accuracy``.

The chapter trains with a ``KerasModel`` class it writes itself (its text: "this training loop
is also torchkeras's core code"); the first test runs it as written, so there torchkeras gives
only ``__version__`` and ``summary``. The second test makes the same ``KerasModel(...)`` and
``fit(...)`` calls on ``torchkeras.KerasModel`` in place of the chapter's class.

Replaced: the IMDB files (``./eat_pytorch_datasets/imdb/train.tsv`` / ``test.tsv``, a download)
by generated reviews of the same layout (``label``, ``text``; words from a small vocabulary,
some punctuation, a few rare words, some reviews longer than 200 words; the label decided by
sentiment words); gensim's ``corpora.Dictionary`` (not installed here) by a stand-in with the
four things the chapter uses of it, with gensim's rules; fewer reviews (4,000 and 500 where
IMDB has 20,000 and 5,000) and epochs (10 there, 4 here). Left out: the plots, ``pip install``
and the Mac-only ``KMP_DUPLICATE_LIB_OK`` setting."""

from __future__ import annotations

import os
import string

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import kerastorch as torchkeras  # the one changed line: "import torchkeras"

pytestmark = pytest.mark.slow

POSITIVE = ["good", "great", "excellent", "wonderful", "loved", "best", "brilliant", "enjoyable"]
NEGATIVE = ["bad", "awful", "boring", "worst", "terrible", "waste", "poor", "dull"]


def imdb_like_table(rows: int, seed: int) -> pd.DataFrame:
    """IMDB's ``train.tsv`` layout: ``label`` (0 or 1) and ``text``. Each review is 20 to 260
    words of a 216-word neutral vocabulary with 41 to 61 sentiment words put among its first
    190, some punctuation, and now and then a rare word (``<unk>`` once the dictionary drops it).
    A review is positive or negative in 9 of 10 of its sentiment words; the label is 1 when the
    positive ones are more, flipped for 5% of the reviews. (With sparser or noisier sentiment the
    chapter's net often stays at chance: its first epoch on IMDB does too, but IMDB gives it 400
    steps an epoch, not 80.)"""
    syllables = ["ka", "lo", "mi", "ne", "ru", "sa", "to", "vi", "ze", "po", "da", "fu"]
    neutral = sorted(a + b + c for a in syllables for b in syllables for c in ["", "n", "s"])[::2]
    rng = np.random.default_rng(seed)
    labels, texts = [], []
    for _ in range(rows):
        words = list(rng.choice(neutral, size=int(rng.integers(20, 261))))
        n_sentiment = int(rng.choice([41, 51, 61]))  # odd, so there is no tie
        n_positive = int(rng.binomial(n_sentiment, rng.choice([0.1, 0.9])))
        chosen = list(rng.choice(POSITIVE, size=n_positive)) + list(rng.choice(NEGATIVE, size=n_sentiment - n_positive))
        for word in chosen:
            words.insert(int(rng.integers(0, min(len(words), 190))), word)
        if rng.random() < 0.3:
            words.insert(int(rng.integers(0, len(words))), f"zq{rng.integers(10**6)}")
        for i in rng.integers(0, len(words), size=3):
            words[i] += str(rng.choice([".", ",", "!", "?"]))
        label = int(n_positive > n_sentiment - n_positive)
        labels.append(1 - label if rng.random() < 0.05 else label)
        texts.append(" ".join(words))
    return pd.DataFrame({"label": labels, "text": texts})


class Dictionary:
    """A stand-in for ``gensim.corpora.Dictionary`` (gensim 4.3) with what the chapter uses:
    ``token2id``, ``filter_extremes``, ``patch_with_special_tokens`` and ``doc2idx``."""

    def __init__(self, documents):
        self.token2id: dict[str, int] = {}
        self.dfs: dict[int, int] = {}
        self.num_docs = 0
        for document in documents:
            self.num_docs += 1
            for token in sorted(set(document) - set(self.token2id)):  # gensim: new tokens in sorted order
                self.token2id[token] = len(self.token2id)
            for token in set(document):
                self.dfs[self.token2id[token]] = self.dfs.get(self.token2id[token], 0) + 1

    def filter_extremes(self, no_below=5, no_above=0.5, keep_n=100000):
        no_above_abs = int(no_above * self.num_docs)
        good = [i for i in self.token2id.values() if no_below <= self.dfs.get(i, 0) <= no_above_abs]
        good = sorted(sorted(good, key=lambda i: -self.dfs[i])[:keep_n])
        new_id = {old: new for new, old in enumerate(good)}  # gensim's compactify keeps the order
        self.token2id = {t: new_id[i] for t, i in self.token2id.items() if i in new_id}
        self.dfs = {new_id[i]: n for i, n in self.dfs.items() if i in new_id}

    def patch_with_special_tokens(self, special_token_dict):
        possible_ids = []
        for token, idx in special_token_dict.items():
            if self.token2id.get(token) == idx:
                continue
            if token in self.token2id:
                possible_ids.append(self.token2id.pop(token))
            id2token = {i: t for t, i in self.token2id.items()}
            if idx in id2token:
                self.token2id[id2token[idx]] = possible_ids.pop() if possible_ids else len(self.token2id)
            self.token2id[token] = idx

    def doc2idx(self, document, unknown_word_index=-1):
        return [self.token2id.get(word, unknown_word_index) for word in document]


def chapter_data_and_net():
    """The chapter's cells up to its net: data, vocabulary, Dataset, DataLoaders, ``Net``."""
    print("torch.__version__ = ", torch.__version__)
    print("torchkeras.__version__ = ", torchkeras.__version__)  # upstream also prints gensim's

    # 每个样本保留200个词的长度
    MAX_LEN = 200
    BATCH_SIZE = 20  # noqa: F841 (as in the book: the loaders below use 50)

    dftrain = imdb_like_table(4000, seed=0)  # upstream: pd.read_csv("./eat_pytorch_datasets/imdb/train.tsv", ...)
    dfval = imdb_like_table(500, seed=1)  # upstream: pd.read_csv("./eat_pytorch_datasets/imdb/test.tsv", ...)

    # 1，文本切词
    def textsplit(text):
        translator = str.maketrans("", "", string.punctuation)
        words = text.translate(translator).split(" ")
        return words

    # 2，构建词典
    vocab = Dictionary(textsplit(text) for text in dftrain["text"])  # upstream: corpora.Dictionary (gensim)
    vocab.filter_extremes(no_below=5, no_above=5000)
    special_tokens = {"<pad>": 0, "<unk>": 1}
    vocab.patch_with_special_tokens(special_tokens)
    vocab_size = len(vocab.token2id)
    print("vocab_size = ", vocab_size)

    # 3，序列填充
    def pad(seq, max_length, pad_value=0):
        n = len(seq)  # noqa: F841 (as in the book)
        result = seq + [pad_value] * max_length
        return result[:max_length]

    # 4，编码转换
    def text_pipeline(text):
        tokens = vocab.doc2idx(textsplit(text))
        tokens = [x if x > 0 else special_tokens["<unk>"] for x in tokens]
        result = pad(tokens, MAX_LEN, special_tokens["<pad>"])
        return result

    print(text_pipeline("this is an example!"))

    # 5，构建管道
    from torch.utils.data import DataLoader, Dataset

    class ImdbDataset(Dataset):
        def __init__(self, df):
            self.df = df

        def __len__(self):
            return len(self.df)

        def __getitem__(self, index):
            text = self.df["text"].iloc[index]
            label = torch.tensor([self.df["label"].iloc[index]]).float()
            tokens = torch.tensor(text_pipeline(text)).int()
            return tokens, label

    ds_train = ImdbDataset(dftrain)
    ds_val = ImdbDataset(dfval)

    dl_train = DataLoader(ds_train, batch_size=50, shuffle=True)
    dl_val = DataLoader(ds_val, batch_size=50, shuffle=False)

    for features, labels in dl_train:  # noqa: B007 (as in the book: the first batch)
        break

    torch.manual_seed(42)

    class Net(nn.Module):
        def __init__(self):
            super(Net, self).__init__()  # noqa: UP008 (as in the book)

            # 设置padding_idx参数后将在训练过程中将填充的token始终赋值为0向量
            self.embedding = nn.Embedding(num_embeddings=vocab_size, embedding_dim=3, padding_idx=0)

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

    return vocab, text_pipeline, dl_train, dl_val, features, labels, Net


def test_the_chapters_own_keras_model_with_torchkeras_summary(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    vocab, text_pipeline, dl_train, dl_val, features, labels, Net = chapter_data_and_net()

    net = Net()
    print(net)

    from kerastorch import summary

    summary(net, input_data=features)

    import datetime
    import sys
    from copy import deepcopy

    from tqdm import tqdm

    def printlog(info):
        nowtime = datetime.datetime.now().strftime("%Y-%m-%d %H:%M:%S")
        print("\n" + "==========" * 8 + "%s" % nowtime)  # noqa: UP031 (as in the book)
        print(str(info) + "\n")

    class StepRunner:
        def __init__(self, net, loss_fn, stage="train", metrics_dict=None, optimizer=None, lr_scheduler=None):
            self.net, self.loss_fn, self.metrics_dict, self.stage = net, loss_fn, metrics_dict, stage
            self.optimizer, self.lr_scheduler = optimizer, lr_scheduler

        def __call__(self, features, labels):
            # loss
            preds = self.net(features)
            loss = self.loss_fn(preds, labels)

            # backward()
            if self.optimizer is not None and self.stage == "train":
                loss.backward()
                self.optimizer.step()
                if self.lr_scheduler is not None:
                    self.lr_scheduler.step()
                self.optimizer.zero_grad()

            # metrics
            step_metrics = {
                self.stage + "_" + name: metric_fn(preds, labels).item()
                for name, metric_fn in self.metrics_dict.items()
            }
            return loss.item(), step_metrics

    class EpochRunner:
        def __init__(self, steprunner):
            self.steprunner = steprunner
            self.stage = steprunner.stage
            self.steprunner.net.train() if self.stage == "train" else self.steprunner.net.eval()

        def __call__(self, dataloader):
            total_loss, step = 0, 0
            loop = tqdm(enumerate(dataloader), total=len(dataloader))
            for i, batch in loop:
                if self.stage == "train":
                    loss, step_metrics = self.steprunner(*batch)
                else:
                    with torch.no_grad():
                        loss, step_metrics = self.steprunner(*batch)
                step_log = dict({self.stage + "_loss": loss}, **step_metrics)

                total_loss += loss
                step += 1  # noqa: SIM113 (as in the book)
                if i != len(dataloader) - 1:
                    loop.set_postfix(**step_log)
                else:
                    epoch_loss = total_loss / step
                    epoch_metrics = {
                        self.stage + "_" + name: metric_fn.compute().item()
                        for name, metric_fn in self.steprunner.metrics_dict.items()
                    }
                    epoch_log = dict({self.stage + "_loss": epoch_loss}, **epoch_metrics)
                    loop.set_postfix(**epoch_log)

                    for name, metric_fn in self.steprunner.metrics_dict.items():  # noqa: B007 (as in the book)
                        metric_fn.reset()
            return epoch_log

    class KerasModel(torch.nn.Module):
        def __init__(self, net, loss_fn, metrics_dict=None, optimizer=None, lr_scheduler=None):
            super().__init__()
            self.history = {}

            self.net = net
            self.loss_fn = loss_fn
            self.metrics_dict = nn.ModuleDict(metrics_dict)

            self.optimizer = optimizer if optimizer is not None else torch.optim.Adam(self.parameters(), lr=1e-2)
            self.lr_scheduler = lr_scheduler

        def forward(self, x):
            if self.net:
                return self.net.forward(x)
            else:
                raise NotImplementedError

        def fit(
            self,
            train_data,
            val_data=None,
            epochs=10,
            ckpt_path="checkpoint.pt",
            patience=5,
            monitor="val_loss",
            mode="min",
        ):
            for epoch in range(1, epochs + 1):
                printlog("Epoch {0} / {1}".format(epoch, epochs))  # noqa: UP030, UP032 (as in the book)

                # 1，train -------------------------------------------------
                train_step_runner = StepRunner(
                    net=self.net,
                    stage="train",
                    loss_fn=self.loss_fn,
                    metrics_dict=deepcopy(self.metrics_dict),
                    optimizer=self.optimizer,
                    lr_scheduler=self.lr_scheduler,
                )
                train_epoch_runner = EpochRunner(train_step_runner)
                train_metrics = train_epoch_runner(train_data)

                for name, metric in train_metrics.items():
                    self.history[name] = self.history.get(name, []) + [metric]

                # 2，validate -------------------------------------------------
                if val_data:
                    val_step_runner = StepRunner(
                        net=self.net, stage="val", loss_fn=self.loss_fn, metrics_dict=deepcopy(self.metrics_dict)
                    )
                    val_epoch_runner = EpochRunner(val_step_runner)
                    with torch.no_grad():
                        val_metrics = val_epoch_runner(val_data)
                    val_metrics["epoch"] = epoch
                    for name, metric in val_metrics.items():
                        self.history[name] = self.history.get(name, []) + [metric]

                # 3，early-stopping -------------------------------------------------
                if not val_data:
                    continue
                arr_scores = self.history[monitor]
                best_score_idx = np.argmax(arr_scores) if mode == "max" else np.argmin(arr_scores)
                if best_score_idx == len(arr_scores) - 1:
                    torch.save(self.net.state_dict(), ckpt_path)
                    print(
                        "<<<<<< reach best {0} : {1} >>>>>>".format(monitor, arr_scores[best_score_idx]),  # noqa: UP030, UP032
                        file=sys.stderr,
                    )
                if len(arr_scores) - best_score_idx > patience:
                    print(
                        "<<<<<< {} without improvement in {} epoch, early stopping >>>>>>".format(monitor, patience),  # noqa: UP032
                        file=sys.stderr,
                    )
                    break

            self.net.load_state_dict(torch.load(ckpt_path, weights_only=True))
            return pd.DataFrame(self.history)

        @torch.no_grad()
        def evaluate(self, val_data):
            val_step_runner = StepRunner(
                net=self.net, stage="val", loss_fn=self.loss_fn, metrics_dict=deepcopy(self.metrics_dict)
            )
            val_epoch_runner = EpochRunner(val_step_runner)
            val_metrics = val_epoch_runner(val_data)
            return val_metrics

        @torch.no_grad()
        def predict(self, dataloader):
            self.net.eval()
            result = torch.cat([self.forward(t[0]) for t in dataloader])
            return result.data

    from torchmetrics import Accuracy

    net = Net()
    keras_model = KerasModel(
        net,
        loss_fn=nn.BCEWithLogitsLoss(),
        optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
        metrics_dict={"acc": Accuracy(task="binary")},
    )

    dfhistory = keras_model.fit(
        dl_train, val_data=dl_val, epochs=4, ckpt_path="checkpoint", patience=3, monitor="val_acc", mode="max"
    )  # upstream: epochs=10

    # 评估
    evaluated = keras_model.evaluate(dl_val)

    def predict(net, dl):
        net.eval()
        with torch.no_grad():
            result = nn.Sigmoid()(torch.cat([net.forward(t[0]) for t in dl]))
        return result.data

    y_pred_probs = predict(net, dl_val)

    # 模型权重已经被保存在了ckpt_path='checkpoint.'
    net_clone = Net()
    net_clone.load_state_dict(torch.load("checkpoint", weights_only=True))

    printed = capsys.readouterr().out
    # What the chapter relies on: the data in its layout (200 int32 ids, <pad> 0 and <unk> 1,
    # float labels of shape (1,)), torchkeras's summary of the net on those ids, the history's
    # columns, a net that learned, and the checkpoint giving back the best epoch's predictions.
    assert features.dtype == torch.int32 and features.shape == (50, 200)
    assert labels.dtype == torch.float32 and labels.shape == (50, 1)
    assert vocab.token2id["<pad>"] == 0 and vocab.token2id["<unk>"] == 1
    assert f"vocab_size =  {len(vocab.token2id)}" in printed
    assert str([1, 1, 1, 1] + [0] * 196) in printed  # text_pipeline("this is an example!"): 4 unknown words
    assert f"torchkeras.__version__ =  {torchkeras.__version__}" in printed
    assert f"Total params: {sum(p.numel() for p in net_clone.parameters()):,}" in printed
    assert "[-1, 200, 3]" in printed  # the embedding's output
    assert "[-1, 1]" in printed
    assert isinstance(dfhistory, pd.DataFrame) and len(dfhistory) == 4
    assert {"train_loss", "train_acc", "val_loss", "val_acc", "epoch"} <= set(dfhistory.columns)
    assert dfhistory["val_acc"].max() > 0.8
    assert set(evaluated) == {"val_loss", "val_acc"}
    assert evaluated["val_acc"] == pytest.approx(dfhistory["val_acc"].max())
    assert y_pred_probs.shape == (500, 1) and ((y_pred_probs >= 0) & (y_pred_probs <= 1)).all()
    assert os.path.isfile("checkpoint")
    assert torch.allclose(predict(net_clone, dl_val), y_pred_probs)


def test_the_chapters_calls_on_torchkeras_keras_model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    vocab, text_pipeline, dl_train, dl_val, features, labels, Net = chapter_data_and_net()

    from torchmetrics import Accuracy

    net = Net()
    keras_model = torchkeras.KerasModel(  # upstream: KerasModel, the chapter's own class
        net,
        loss_fn=nn.BCEWithLogitsLoss(),
        optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
        metrics_dict={"acc": Accuracy(task="binary")},
    )

    dfhistory = keras_model.fit(
        dl_train, val_data=dl_val, epochs=4, ckpt_path="checkpoint", patience=3, monitor="val_acc", mode="max"
    )  # upstream: epochs=10

    # 评估
    evaluated = keras_model.evaluate(dl_val)

    def predict(net, dl):
        net.eval()
        with torch.no_grad():
            result = nn.Sigmoid()(torch.cat([net.forward(t[0]) for t in dl]))
        return result.data

    y_pred_probs = predict(net, dl_val)

    # 模型权重已经被保存在了ckpt_path='checkpoint.'
    net_clone = Net()
    net_clone.load_state_dict(torch.load("checkpoint", weights_only=True))

    # The same as with the chapter's class: the history, evaluate's keys, a net that learned
    # (the best epoch's weights back in `net`), and the checkpoint giving its predictions.
    assert isinstance(dfhistory, pd.DataFrame) and len(dfhistory) == 4
    assert {"train_loss", "train_acc", "val_loss", "val_acc", "epoch"} <= set(dfhistory.columns)
    assert dfhistory["val_acc"].max() > 0.8
    assert set(evaluated) == {"val_loss", "val_acc"}
    assert evaluated["val_acc"] == pytest.approx(dfhistory["val_acc"].max())
    assert y_pred_probs.shape == (500, 1) and ((y_pred_probs >= 0) & (y_pred_probs <= 1)).all()
    val_labels = torch.cat([t[1] for t in dl_val])
    assert ((y_pred_probs > 0.5).float() == val_labels).float().mean().item() == pytest.approx(evaluated["val_acc"])
    assert os.path.isfile("checkpoint")
    assert torch.allclose(predict(net_clone, dl_val), y_pred_probs)
