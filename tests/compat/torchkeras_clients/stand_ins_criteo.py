"""A stand-in for the book's ``eat_pytorch_datasets/criteo_small.zip`` (chapters 7-3 FM, 7-4
DeepFM, 7-5 FiBiNET and 7-6 DeepCross), which is a download, and the code those chapters define
the same way.

Each chapter defines its layers and its ``DfDataset`` in its own notebook. The ones written the
same in several chapters (the same code; only docstrings and comments differ) are here, once,
as the book writes them: ``NumEmbedding`` and ``CatEmbedding`` (7-3, 7-4, 7-5), ``CatLinear``
and ``FMLayer`` (7-3, 7-4; 7-5's ``CatLinear`` also initializes its weights, so it stays in
that chapter's test), ``MultiLayerPerceptron`` (7-4, 7-5) and ``DfDataset`` (all four). Each
chapter's own model stays in its test.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from torch import Tensor, nn
from torch.utils.data import Dataset


def criteo_like_table(rows: int = 12000, seed: int = 0) -> pd.DataFrame:
    """Criteo's layout (label, I1..I13 with NaNs, C14..C39 as hex strings); the label depends
    on two numerical and two categorical columns, so there is something to learn."""
    rng = np.random.default_rng(seed)
    numbers = rng.lognormal(1.0, 1.0, size=(rows, 13))
    numbers[rng.random((rows, 13)) < 0.1] = np.nan
    codes = rng.integers(0, 12, size=(rows, 26))
    score = np.nan_to_num(np.log1p(numbers[:, 0]) - np.log1p(numbers[:, 1])) + (codes[:, 0] < 4) - (codes[:, 1] < 3)
    label = (score + rng.normal(0, 0.5, rows) > 0.3).astype(int)
    table = pd.DataFrame({0: label})
    for i in range(13):
        table[1 + i] = numbers[:, i]
    for i in range(26):
        table[14 + i] = [f"{hash((i, c)) & 0xFFFFFFFF:08x}" for c in codes[:, i]]
    return table


class NumEmbedding(nn.Module):
    """
    连续特征用linear层编码
    输入shape: [batch_size,features_num(n), d_in], # d_in 通常是1
    输出shape: [batch_size,features_num(n), d_out]
    """

    def __init__(self, n: int, d_in: int, d_out: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(Tensor(n, d_in, d_out))
        self.bias = nn.Parameter(Tensor(n, d_out)) if bias else None
        with torch.no_grad():
            for i in range(n):
                layer = nn.Linear(d_in, d_out)
                self.weight[i] = layer.weight.T
                if self.bias is not None:
                    self.bias[i] = layer.bias

    def forward(self, x_num):
        # x_num: batch_size, features_num, d_in
        assert x_num.ndim == 3
        x = torch.einsum("bfi,fij->bfj", x_num, self.weight)
        if self.bias is not None:
            x = x + self.bias[None]
        return x


class CatEmbedding(nn.Module):
    """
    离散特征用Embedding层编码
    输入shape: [batch_size,features_num],
    输出shape: [batch_size,features_num, d_embed]
    """

    def __init__(self, categories, d_embed):
        super().__init__()
        self.embedding = nn.Embedding(sum(categories), d_embed)
        self.offsets = nn.Parameter(torch.tensor([0] + categories[:-1]).cumsum(0), requires_grad=False)

        torch.nn.init.xavier_uniform_(self.embedding.weight.data)

    def forward(self, x_cat):
        """
        :param x_cat: Long tensor of size ``(batch_size, features_num)``
        """
        x = x_cat + self.offsets[None]
        return self.embedding(x)


class CatLinear(nn.Module):
    """
    离散特征用Embedding实现线性层（等价于先F.onehot再nn.Linear()）
    输入shape: [batch_size,features_num],
    输出shape: [batch_size,d_out]
    """

    def __init__(self, categories, d_out=1):
        super().__init__()
        self.fc = nn.Embedding(sum(categories), d_out)
        self.bias = nn.Parameter(torch.zeros((d_out,)))
        self.offsets = nn.Parameter(torch.tensor([0] + categories[:-1]).cumsum(0), requires_grad=False)

    def forward(self, x_cat):
        """
        :param x: Long tensor of size ``(batch_size, features_num)``
        """
        x = x_cat + self.offsets[None]
        return torch.sum(self.fc(x), dim=1) + self.bias


class FMLayer(nn.Module):
    """
    FM交互项
    """

    def __init__(self, reduce_sum=True):
        super().__init__()
        self.reduce_sum = reduce_sum

    def forward(self, x):  # 注意：这里的x是公式中的 <v_i> * xi
        """
        :param x: Float tensor of size ``(batch_size, num_features, k)``
        """
        square_of_sum = torch.sum(x, dim=1) ** 2
        sum_of_square = torch.sum(x**2, dim=1)
        ix = square_of_sum - sum_of_square
        if self.reduce_sum:
            ix = torch.sum(ix, dim=1, keepdim=True)
        return 0.5 * ix


# deep部分
class MultiLayerPerceptron(nn.Module):
    def __init__(self, d_in, d_layers, dropout, d_out=1):
        super().__init__()
        layers = []
        for d in d_layers:
            layers.append(nn.Linear(d_in, d))
            layers.append(nn.BatchNorm1d(d))
            layers.append(nn.ReLU())
            layers.append(nn.Dropout(p=dropout))
            d_in = d
        layers.append(nn.Linear(d_layers[-1], d_out))
        self.mlp = nn.Sequential(*layers)

    def forward(self, x):
        """
        :param x: Float tensor of size ``(batch_size, d_in)``
        """
        return self.mlp(x)


# DataFrame转换成torch数据集Dataset, 特征分割成X_num,X_cat方式
class DfDataset(Dataset):
    def __init__(self, df, label_col, num_features, cat_features, categories, is_training=True):
        self.X_num = torch.tensor(df[num_features].values).float() if num_features else None
        self.X_cat = torch.tensor(df[cat_features].values).long() if cat_features else None
        self.Y = torch.tensor(df[label_col].values).float()
        self.categories = categories
        self.is_training = is_training

    def __len__(self):
        return len(self.Y)

    def __getitem__(self, index):
        if self.is_training:
            return ((self.X_num[index], self.X_cat[index]), self.Y[index])
        else:
            return (self.X_num[index], self.X_cat[index])

    def get_categories(self):
        return self.categories
