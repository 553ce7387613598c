"""History plots: ``plot_history`` and the live plot of ``fit(plot=True)`` outside Jupyter."""

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch
import torchmetrics
from torch import nn

import kerastorch as kt
from kerastorch.examples import digits_loaders

REPO_ROOT = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def history():
    return pd.DataFrame(
        {
            "epoch": [1, 2, 3, 4],
            "train_loss": [1.0, 0.6, 0.4, 0.3],
            "train_acc": [0.5, 0.7, 0.8, 0.9],
            "lr": [0.1] * 4,
            "val_loss": [1.1, 0.7, 0.8, math.nan],
            "val_acc": [0.4, 0.8, 0.75, math.nan],
        }
    )


def curves(ax) -> dict:
    return {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    }


def test_plot_history_draws_every_quantity_and_marks_the_best_epoch():
    fig = kt.plot_history(history(), monitor="val_acc", mode="max")
    loss_ax, acc_ax = fig.axes
    assert (loss_ax.get_title(), acc_ax.get_title()) == ("loss", "acc")
    assert curves(loss_ax)["train_loss"][1] == [1.0, 0.6, 0.4, 0.3]
    assert curves(acc_ax)["best val_acc"] == ([2], [0.8])  # the star; the NaN epoch is never best
    assert fig._suptitle.get_text() == "best val_acc = 0.8 at epoch 2"
    assert "lr" not in [ax.get_title() for ax in fig.axes]
    assert fig.to_png().startswith(PNG_MAGIC) and fig._repr_png_().startswith(PNG_MAGIC)


def test_plot_history_defaults_to_val_loss_and_picks_metrics_by_name():
    fig = kt.plot_history(history())
    assert fig._suptitle.get_text() == "best val_loss = 0.7 at epoch 2"
    only_acc = kt.plot_history(history(), metrics=["val_acc"])
    assert [ax.get_title() for ax in only_acc.axes] == ["acc"]
    train_only = history()[["epoch", "train_loss"]]
    assert kt.plot_history(train_only)._suptitle.get_text() == "best train_loss = 0.3 at epoch 4"


def test_plot_history_errors_name_what_is_there():
    with pytest.raises(ValueError, match=r"no 'f1' to plot; this history has \['loss', 'acc'\]"):
        kt.plot_history(history(), metrics=["f1"])
    with pytest.raises(ValueError, match="monitor='val_f1' is not a column"):
        kt.plot_history(history(), monitor="val_f1")
    with pytest.raises(ValueError, match="'epoch' column"):
        kt.plot_history(history().drop(columns="epoch"))
    with pytest.raises(ValueError, match="mode='best'"):
        kt.plot_history(history(), mode="best")
    with pytest.raises(ValueError, match="no epochs"):
        kt.plot_history(history().iloc[:0])


def small_model():
    kt.seed_everything(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return kt.KerasModel(
        net,
        loss_fn=nn.CrossEntropyLoss(),
        metrics_dict={
            "acc": torchmetrics.Accuracy(task="multiclass", num_classes=10),
            "top3": torchmetrics.Accuracy(task="multiclass", num_classes=10, top_k=3),
        },
        optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
    )


def test_live_plot_outside_jupyter_rewrites_one_png_and_prints_its_path_once(tmp_path, capsys):
    dl_train, dl_val, _ = digits_loaders(size=8)
    live = kt.callbacks.LivePlot(monitor="val_acc", mode="max", path=str(tmp_path / "plots" / "run.png"))
    dfhistory = small_model().fit(
        dl_train, dl_val, epochs=3, patience=None, monitor="val_acc", mode="max", callbacks=[live], verbose=0
    )
    assert os.listdir(tmp_path / "plots") == ["run.png"]  # no partial files left beside it
    assert (tmp_path / "plots" / "run.png").read_bytes().startswith(PNG_MAGIC)
    printed = capsys.readouterr().out
    assert printed.count("Live plot:") == 1 and str(tmp_path / "plots" / "run.png") in printed
    # The loss and the monitored metric only (not top3), the best epoch in the title.
    assert [ax.get_title() for ax in live.figure.axes] == ["loss", "acc"]
    best = dfhistory.loc[dfhistory["val_acc"].idxmax()]
    assert live.figure._suptitle.get_text() == f"best val_acc = {best['val_acc']:.4g} at epoch {int(best['epoch'])}"


def test_live_plot_refuses_unknown_metrics_before_training(tmp_path):
    model = small_model()
    before = [p.detach().clone() for p in model.net.parameters()]
    with pytest.raises(ValueError, match=r"\['val_f1'\] will not be logged; this model logs \['loss', 'acc', 'top3'\]"):
        model.fit(
            *digits_loaders(size=8)[:2],
            epochs=1,
            verbose=0,
            callbacks=[kt.callbacks.LivePlot(metrics=["loss", "val_f1"], path=str(tmp_path / "run.png"))],
        )
    assert all(torch.equal(a, b) for a, b in zip(before, model.net.parameters()))
    assert not (tmp_path / "run.png").exists()


@pytest.mark.slow
def test_fit_plot_true_in_a_script_never_imports_pyplot_and_logs_one_line_per_epoch(tmp_path):
    """A real script with its output piped, as in a CI log: no window, no flood of redraws."""
    script = textwrap.dedent("""
        import sys
        import torch
        from torch import nn
        import kerastorch as kt
        from kerastorch.examples import digits_loaders

        dl_train, dl_val, _ = digits_loaders(size=8)
        net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
        model = kt.KerasModel(net, loss_fn=nn.CrossEntropyLoss())
        model.fit(dl_train, dl_val, epochs=3, patience=None, plot=True)
        print("pyplot imported:", "matplotlib.pyplot" in sys.modules)
    """)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
        "MPLBACKEND": "TkAgg",
    }  # an interactive backend: would open a window if pyplot were used
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert "pyplot imported: False" in output
    assert "\r" not in output  # no redrawn bars in a log
    epoch_lines = [line for line in output.splitlines() if line.startswith("Epoch ")]
    assert [line.split(" (")[0] for line in epoch_lines] == ["Epoch 1/3", "Epoch 2/3", "Epoch 3/3"]
    assert all("val_loss=" in line for line in epoch_lines)
    assert output.count("Live plot:") == 1
    assert (tmp_path / "kerastorch_history.png").read_bytes().startswith(PNG_MAGIC)
