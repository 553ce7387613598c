"""Fine-tune a Hugging Face model with fit: a tiny BERT built from a config.

Its weights are random and nothing is downloaded. It learns from token ids, as a
tokenizer would give them, with a metric, early stopping and predict.

Batches are dicts: ``input_ids``, ``attention_mask`` and ``labels``. With no
``loss_fn``, fit hands the whole dict to the model, which computes its own loss from
the labels (``output.loss``). The metrics and ``predict`` get ``output.logits``.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded

import torch
import torchmetrics
from torch.utils.data import DataLoader
from transformers import BertConfig, BertForSequenceClassification

import kerastorch as kt

kt.seed_everything(0)

# 512 "sentences" of 12 token ids: the positive ones use the low half of the vocabulary
VOCAB, LENGTH = 64, 12
labels = torch.randint(0, 2, (512,))
low = torch.randint(2, VOCAB // 2, (512, LENGTH))
high = torch.randint(VOCAB // 2, VOCAB, (512, LENGTH))
input_ids = torch.where(labels[:, None] == 1, low, high)
mask = torch.ones(LENGTH, dtype=torch.long)
rows = [
    {"input_ids": input_ids[i], "attention_mask": mask, "labels": labels[i]}
    for i in range(512)
]
# torch's default collate stacks the dicts into a dict of batches
dl_train = DataLoader(rows[:384], batch_size=32, shuffle=True)
dl_val = DataLoader(rows[384:], batch_size=64)

config = BertConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=LENGTH,
    num_labels=2,
)
net = BertForSequenceClassification(config)
model = kt.KerasModel(
    net,  # no loss_fn: the model's own loss
    metrics_dict={"acc": torchmetrics.Accuracy(task="multiclass", num_classes=2)},
    optimizer=torch.optim.AdamW(net.parameters(), lr=1e-3),
)
history = model.fit(dl_train, dl_val, epochs=10, monitor="val_acc", patience=2)

logits = model.predict(dl_val)  # output.logits of every batch, on the CPU
accuracy = (logits.argmax(dim=1) == labels[384:]).float().mean()
print(f"predict: {tuple(logits.shape)}, accuracy {accuracy:.3f}")
