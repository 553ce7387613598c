"""The README's demo: ``python -m kerastorch.demo``.

Trains seed 003's CNN on handwritten digits that ship with scikit-learn (no download),
prints progress, the history table and the test accuracy, and saves a history plot.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torchmetrics
from torch import nn

import kerastorch as kt
from kerastorch.examples import create_cnn, digits_loaders


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--plot", default="demo_history.png", help="where to save the history plot")
    args = parser.parse_args(argv)

    kt.seed_everything(0)
    dl_train, dl_test = digits_loaders(batch_size=64)
    net = create_cnn()
    model = kt.KerasModel(
        net,
        loss_fn=nn.CrossEntropyLoss(),
        metrics_dict={"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)},
        optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
    )
    dfhistory = model.fit(dl_train, dl_test, epochs=args.epochs, patience=5, monitor="val_acc", mode="max")
    print()
    print(dfhistory.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    scores = model.evaluate(dl_test, quiet=True)
    print(f"\ntest accuracy of the restored best weights: {scores['val_acc']:.4f}")
    kt.plot_history(dfhistory, monitor="val_acc", mode="max").savefig(args.plot, dpi=90)
    print(f"history plot saved to {args.plot}")
    return 0 if scores["val_acc"] >= 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
