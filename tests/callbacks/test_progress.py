"""Progress output: text bars in a terminal, one line per epoch in logs, no device reads per step.

The Jupyter form (one output updated in place) is checked in a real kernel by
tests/project/test_notebooks.py.
"""

import io
import os
import struct
import threading

import pytest
import torch
import torchmetrics
from torch import nn

import kerastorch as kt
from kerastorch.callbacks import ProgressBar
from kerastorch.examples import digits_loaders
from kerastorch.helpers.notebook import output_style
from kerastorch.training.callback_list import CallbackList
from kerastorch.training.meters import EpochMeters


@pytest.fixture(scope="module")
def loaders():
    return digits_loaders(batch_size=64, size=8)[:2]  # 22 training steps per epoch


def small_model():
    kt.seed_everything(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    return kt.KerasModel(
        net,
        loss_fn=nn.CrossEntropyLoss(),
        metrics_dict={"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)},
        optimizer=torch.optim.Adam(net.parameters(), lr=0.01),
    )


def screen_after_fit(loaders, columns, epochs=3, **fit_kwargs):
    """What a person sees in a terminal ``columns`` wide after a fit: a real pty, its bytes
    played on a terminal emulator (pyte), tall enough that nothing scrolls away."""
    fcntl, termios = pytest.importorskip("fcntl"), pytest.importorskip("termios")  # POSIX terminals
    pyte = pytest.importorskip("pyte", reason="the terminal emulator is in the test extra")
    master, replica = os.openpty()  # a real terminal device, as when training from a shell
    fcntl.ioctl(replica, termios.TIOCSWINSZ, struct.pack("HHHH", 200, columns, 0, 0))
    received = bytearray()

    def drain():  # read while training writes, so a full terminal buffer never blocks it
        while True:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                return
            if not chunk:
                return
            received.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    with os.fdopen(replica, "w") as terminal:
        assert output_style(terminal) == "terminal"
        model = small_model()
        history = model.fit(
            *loaders,
            epochs=epochs,
            patience=None,
            verbose=0,
            callbacks=[ProgressBar(mininterval=0, file=terminal)],
            **fit_kwargs,
        )
        terminal.flush()
        for _ in range(100):
            reader.join(0.02)
            if bytes(received).count("★".encode()) and bytes(received).count(b"val_acc=") >= epochs:
                break
    os.close(master)
    screen = pyte.Screen(columns, 200)
    pyte.ByteStream(screen).feed(bytes(received).replace(b"\n", b"\r\n"))
    return history, [line.rstrip() for line in screen.display if line.strip()]


@pytest.mark.parametrize("columns", [80, 120])
def test_in_a_terminal_every_value_of_every_epoch_stays_readable_in_full(loaders, columns):
    history, lines = screen_after_fit(loaders, columns, epochs=3)
    assert all(len(line) <= columns for line in lines)
    text = "\n".join(lines)
    assert "%|" not in text  # the bars were replaced by the epochs' lines
    for row in history.itertuples():
        assert f"Epoch {row.epoch}/3 (" in text
        for name in ("train_loss", "train_acc", "val_loss", "val_acc"):
            assert f"{name}={getattr(row, name):.4g}" in text, (name, text)  # whole numbers, never cut
    # The monitored value (val_loss, the default) is marked on each epoch that improved it.
    improved = history["val_loss"] < history["val_loss"].cummin().shift(fill_value=float("inf"))
    assert text.count("★ best") == int(improved.sum()) >= 1
    assert f"val_loss={history.val_loss.iloc[0]:.4g} ★ best" in text


def test_in_a_log_an_epoch_is_one_line(loaders, capsys):
    small_model().fit(*loaders, epochs=3, patience=None)  # pytest captures output: not a terminal
    captured = capsys.readouterr()
    assert "\r" not in captured.out + captured.err
    lines = [line for line in captured.out.splitlines() if line.startswith("Epoch")]
    assert [line.split(" (")[0] for line in lines] == ["Epoch 1/3", "Epoch 2/3", "Epoch 3/3"]
    assert all("train_acc=" in line and "val_acc=" in line for line in lines)


def test_verbose_0_prints_nothing_and_verbose_2_prints_lines_anywhere(loaders, capsys):
    small_model().fit(*loaders, epochs=2, patience=None, verbose=0)
    assert capsys.readouterr().out == ""
    terminal_like = io.StringIO()
    small_model().fit(
        *loaders,
        epochs=2,
        patience=None,
        verbose=0,
        callbacks=[ProgressBar(verbose=2, style="terminal", file=terminal_like)],
    )
    assert terminal_like.getvalue() == ""
    assert [line[:9] for line in capsys.readouterr().out.splitlines()] == ["Epoch 1/2", "Epoch 2/2"]


@pytest.mark.parametrize("mininterval, step_reads", [(3600.0, 0), (0.0, 2 * 22)])
def test_the_bar_reads_the_device_only_when_it_redraws(loaders, monkeypatch, mininterval, step_reads):
    reads = []
    real_read = EpochMeters.read

    def counting_read(self, synced=True):
        reads.append(synced)
        return real_read(self, synced)

    monkeypatch.setattr(EpochMeters, "read", counting_read)
    bar = ProgressBar(mininterval=mininterval, style="terminal", file=io.StringIO())
    small_model().fit(*loaders, epochs=2, patience=None, verbose=0, callbacks=[bar])
    # Step logs are read unsynced; epoch ends read the exact, synced values (train and val).
    assert reads.count(False) == step_reads
    assert reads.count(True) == 2 * 2


def test_only_a_drawn_bar_is_called_at_every_step(loaders, monkeypatch):
    # The epoch's line alone (logs, pipes, verbose=2) needs no call per step: the loop makes none.
    # One bar object used for a terminal run, then for a run whose output is a log, follows each.
    batch_ends = []
    real_listeners = CallbackList.listeners

    def counted(hook):
        def call(batch, logs=None):
            batch_ends.append(batch)
            return hook(batch, logs)

        return call

    def counting_listeners(self, hook):
        found = real_listeners(self, hook)
        return [counted(fn) for fn in found] if hook == "on_train_batch_end" else found

    monkeypatch.setattr(CallbackList, "listeners", counting_listeners)
    terminal = io.StringIO()
    bar = ProgressBar(mininterval=0, style="terminal", file=terminal)
    small_model().fit(*loaders, epochs=1, patience=None, verbose=0, callbacks=[bar])
    assert batch_ends == list(range(22)) and "22/22" in terminal.getvalue()
    bar.style, bar.file = "lines", None
    log = io.StringIO()
    monkeypatch.setattr("sys.stdout", log)
    small_model().fit(*loaders, epochs=2, patience=None, verbose=0, callbacks=[bar])
    assert batch_ends == list(range(22))
    assert [line[:10] for line in log.getvalue().splitlines()] == ["Epoch 1/2 ", "Epoch 2/2 "]


def test_a_bar_of_the_users_own_with_a_step_hook_is_still_called_at_every_step(loaders, monkeypatch):
    steps = []

    class CountingBar(ProgressBar):
        def on_train_batch_end(self, batch, logs=None):
            steps.append(batch)
            super().on_train_batch_end(batch, logs)

    monkeypatch.setattr("sys.stdout", io.StringIO())
    small_model().fit(*loaders, epochs=1, patience=None, verbose=0, callbacks=[CountingBar(style="lines")])
    assert steps == list(range(22))


def test_unknown_style_is_refused():
    with pytest.raises(ValueError, match="style='fancy'.*'auto', 'notebook', 'terminal', 'lines'"):
        ProgressBar(style="fancy")


def test_the_last_line_names_the_restored_epoch_and_its_monitored_value(loaders, capsys):
    dfhistory = small_model().fit(*loaders, epochs=3, patience=None, monitor="val_acc", mode="max")
    best = dfhistory.loc[dfhistory["val_acc"].idxmax()]
    last_line = capsys.readouterr().out.splitlines()[-1]
    assert last_line == f"Restored the weights of epoch {int(best['epoch'])} (val_acc {best['val_acc']:.4f}, the best)."


def test_the_best_mark_is_on_the_epoch_whose_weights_fit_restores(loaders, capsys):
    # min_delta larger than any change: only epoch 1 improves, so fit keeps epoch 1's weights,
    # and the mark must say so even though val_loss still falls a little afterwards.
    history = small_model().fit(*loaders, epochs=3, min_delta=10.0, patience=None, verbose=2)
    assert history["val_loss"].iloc[2] < history["val_loss"].iloc[0]
    marked = [line for line in capsys.readouterr().out.splitlines() if "★ best" in line]
    assert len(marked) == 1 and marked[0].startswith("Epoch 1/3")
