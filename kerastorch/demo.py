"""The README's demo: ``python -m kerastorch.demo``.

Trains seed 003's CNN on handwritten digits that ship with scikit-learn (no download).
fit picks the best epoch on the validation digits; the demo then reports the accuracy of
those weights on the test digits, which training never saw, and saves a history plot.
It exits non-zero when the test accuracy is below 0.90.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torchmetrics
from torch import nn

import kerastorch as kt
from kerastorch.examples import create_cnn, digits_loaders

PASS_MARK = 0.90


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--plot", default="demo_history.png", help="where to save the history plot")
    args = parser.parse_args(argv)

    kt.seed_everything(0)
    dl_train, dl_val, dl_test = digits_loaders(batch_size=64)
    net = create_cnn()
    model = kt.KerasModel(
        net,
        loss_fn=nn.CrossEntropyLoss(),
        metrics_dict={"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)},
        optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
    )
    dfhistory = model.fit(dl_train, dl_val, epochs=args.epochs, patience=5, monitor="val_acc", mode="max")
    print()
    print(dfhistory.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
    # evaluate names its scores as the history names validation values: val_loss, val_acc.
    test_accuracy = model.evaluate(dl_test, verbose=0)["val_acc"]
    n_val, n_test = len(dl_val.dataset), len(dl_test.dataset)  # type: ignore[arg-type]
    print(
        f"\nbest epoch chosen on {n_val} validation digits; "
        f"test accuracy on {n_test} digits it never saw: {test_accuracy:.4f}"
    )
    kt.plot_history(dfhistory, monitor="val_acc", mode="max").savefig(args.plot, dpi=90)
    print(f"history plot saved to {args.plot}")
    if test_accuracy < PASS_MARK:
        print(f"the test accuracy is below {PASS_MARK}: something is wrong", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
