"""PyTorch's text classification tutorial with fit: an ``nn.EmbeddingBag`` over batches that a
``collate_fn`` makes as ``(labels, text, offsets)``.

The tutorial's batches hold their labels first, and its model is called ``model(text, offsets)``.
``KerasModel(..., labels_at=0)`` says so: fit calls ``net(batch[1], batch[2])`` and reads the labels
from ``batch[0]``; ``evaluate`` and ``predict`` read the batches the same way. (Without it, fit reads
the last item as the labels, calls ``net(labels, text)``, and its first-batch error says what it
called and points here.) The token ids stand in for torchtext's vocabulary: 4 classes of "news",
each with words of its own.
"""

import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader

import kerastorch as kt

VOCAB, CLASSES = 200, 4


class TextClassificationModel(nn.Module):  # the tutorial's model, as it is
    def __init__(self, vocab_size, embed_dim, num_class):
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab_size, embed_dim, sparse=False)
        self.fc = nn.Linear(embed_dim, num_class)
        self.init_weights()

    def init_weights(self):
        initrange = 0.5
        self.embedding.weight.data.uniform_(-initrange, initrange)
        self.fc.weight.data.uniform_(-initrange, initrange)
        self.fc.bias.data.zero_()

    def forward(self, text, offsets):
        embedded = self.embedding(text, offsets)
        return self.fc(embedded)


def collate_batch(batch):  # the tutorial's collate_fn: (labels, all the tokens in a row, where each text starts)
    label_list, text_list, offsets = [], [], [0]
    for label, tokens in batch:
        label_list.append(label)
        text_list.append(tokens)
        offsets.append(tokens.size(0))
    offsets = torch.tensor(offsets[:-1]).cumsum(dim=0)
    return torch.tensor(label_list, dtype=torch.int64), torch.cat(text_list), offsets


def news(count, generator):
    """(label, token ids) pairs: texts of 5 to 20 words, most from their class's quarter of the vocabulary."""
    samples = []
    for _ in range(count):
        label = int(torch.randint(0, CLASSES, (1,), generator=generator))
        length = int(torch.randint(5, 21, (1,), generator=generator))
        own = torch.randint(0, VOCAB // CLASSES, (length,), generator=generator) + label * (VOCAB // CLASSES)
        shared = torch.randint(0, VOCAB, (length,), generator=generator)
        words = torch.where(torch.rand(length, generator=generator) < 0.7, own, shared)
        samples.append((label, words))
    return samples


if __name__ == "__main__":
    kt.seed_everything(0)
    generator = torch.Generator().manual_seed(0)
    dl_train = DataLoader(news(1600, generator), batch_size=64, shuffle=True, collate_fn=collate_batch)
    dl_val = DataLoader(news(400, generator), batch_size=64, collate_fn=collate_batch)

    net = TextClassificationModel(VOCAB, 64, CLASSES)
    model = kt.KerasModel(
        net,
        loss_fn=nn.CrossEntropyLoss(),
        metrics_dict={"acc": torchmetrics.Accuracy(task="multiclass", num_classes=CLASSES)},
        optimizer=torch.optim.SGD(net.parameters(), lr=5.0),
        labels_at=0,  # the batches are (labels, text, offsets): net(text, offsets)
    )
    history = model.fit(dl_train, dl_val, epochs=5, gradient_clip_val=0.1, monitor="val_acc")
    scores = model.predict(dl_val)  # the same batches: the labels are left out, as in fit
    print(f"predict: {tuple(scores.shape)}")
