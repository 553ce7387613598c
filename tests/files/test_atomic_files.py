"""The files kerastorch writes atomically (best weights, training states, ModelCheckpoint files,
``save_ckpt``) come out as a plain ``open`` would make them, a write the run was killed in leaves
nothing behind for long, and a Ctrl-C waits until the file is whole."""

from __future__ import annotations

import os
import signal
import stat
import threading

import pytest
import torch
from torch import nn

import kerastorch as kt
from conftest import make_mlp
from helpers import ran_where_file_modes_bind
from kerastorch.files import state as state_files
from kerastorch.files.atomic import atomic_write
from kerastorch.files.state import load_state_file


def sgd_model(net):
    return kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def python_handles_ctrl_c():
    """Python's own SIGINT handler, whatever the test process was started with: a process started in
    the background (``cmd &``, nohup, some CI runners) ignores SIGINT, and a real Ctrl-C would do nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def umask_027():
    previous = os.umask(0o027)
    yield
    os.umask(previous)


def test_files_get_the_mode_open_gives_under_the_umask(loaders, tmp_path, umask_027):
    dl_train, dl_val = loaders
    model = sgd_model(make_mlp())
    ckpt = tmp_path / "best.safetensors"
    every = kt.callbacks.ModelCheckpoint(str(tmp_path / "e{epoch}.pt"))
    model.fit(dl_train, dl_val, epochs=1, verbose=0, ckpt_path=ckpt, resume=True, callbacks=[every])
    model.save_ckpt(tmp_path / "saved.pt")
    written = ["best.safetensors", "best.safetensors.state", "e1.pt", "saved.pt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(written)
    assert {name: oct(mode_of(tmp_path / name)) for name in written} == {name: oct(0o640) for name in written}


def test_a_replaced_file_keeps_its_mode(loaders, tmp_path, umask_027):
    dl_train, dl_val = loaders
    ckpt = tmp_path / "best.safetensors"
    ckpt.write_bytes(b"")
    ckpt.chmod(0o664)  # shared with a group, wider than the umask allows a new file
    sgd_model(make_mlp()).fit(dl_train, dl_val, epochs=1, verbose=0, ckpt_path=ckpt)
    assert os.path.getsize(ckpt) > 0
    assert oct(mode_of(ckpt)) == oct(0o664)


@pytest.mark.slow  # as root, it runs again in a child process (see ran_where_file_modes_bind)
@pytest.mark.parametrize("name", ["best.safetensors", "best.pt"])
def test_a_read_only_file_is_replaced_and_stays_read_only(loaders, tmp_path, name, request):
    # A checkpoint made read-only (chmod a-w, a data-versioning tool's cache): the run writes it anew.
    if ran_where_file_modes_bind(request):
        return
    dl_train, dl_val = loaders
    ckpt = tmp_path / name
    ckpt.write_bytes(b"")
    ckpt.chmod(0o444)
    model = sgd_model(make_mlp())
    model.fit(dl_train, dl_val, epochs=1, verbose=0, ckpt_path=ckpt)
    assert oct(mode_of(ckpt)) == oct(0o444) and os.path.getsize(ckpt) > 0
    fresh = sgd_model(make_mlp())
    fresh.load_ckpt(ckpt)
    assert all(torch.equal(a, b) for a, b in zip(fresh.net.state_dict().values(), model.net.state_dict().values()))
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_a_run_removes_the_temporary_files_a_killed_write_left_beside_its_files(loaders, tmp_path):
    """A ``kill -9`` in the middle of a write leaves ``.<name>.<random>.tmp`` as large as the file;
    the next run that writes there removes it, also without ``resume``."""
    dl_train, dl_val = loaders
    left = [".best.pt.0f3a9c2e.tmp", ".e7-0.31.pt.77aa01bc.tmp", ".last.pt.1234abcd.tmp"]
    # Not a write of these paths; and a template that starts with a field ("{epoch}.pt") would match any
    # .pt name: another run's write under way in the same folder stays.
    kept = [".best.pt.notes", ".other.pt.0f3a9c2e.tmp", "e7-0.31.pt"]
    for name in left + kept:
        (tmp_path / name).write_bytes(b"\0" * 1000)
    callbacks = [
        kt.callbacks.ModelCheckpoint(str(tmp_path / "e{epoch}-{val_loss:.2f}.pt")),
        kt.callbacks.ModelCheckpoint(str(tmp_path / "last.pt")),
        kt.callbacks.ModelCheckpoint(str(tmp_path / "{epoch}.pt")),
    ]
    sgd_model(make_mlp()).fit(
        dl_train, dl_val, epochs=1, verbose=0, ckpt_path=tmp_path / "best.pt", callbacks=callbacks
    )
    names = sorted(p.name for p in tmp_path.iterdir())
    assert not set(left) & set(names)
    assert set(kept) <= set(names)


def test_a_ctrl_c_during_the_training_states_write_keeps_the_state_of_the_finished_epoch(
    loaders, tmp_path, monkeypatch, python_handles_ctrl_c
):
    """With a callback of yours, the state is written on the training thread; a Ctrl-C (a real SIGINT)
    that arrives while it is half written is acted on once the file is whole: fit returns the finished
    epoch, and the next run goes on after it."""
    dl_train, dl_val = loaders
    ckpt = tmp_path / "best.safetensors"
    real_atomic_write, interrupted = state_files.atomic_write, []

    def ctrl_c_in_the_middle(path, write):
        def write_after_a_ctrl_c(tmp):
            if not interrupted:
                assert threading.current_thread() is threading.main_thread()
                interrupted.append(path)
                os.kill(os.getpid(), signal.SIGINT)  # Python's handler raises KeyboardInterrupt at once
            write(tmp)

        real_atomic_write(path, write_after_a_ctrl_c)

    monkeypatch.setattr(state_files, "atomic_write", ctrl_c_in_the_middle)
    yours = kt.callbacks.LambdaCallback(on_epoch_end=lambda epoch, logs: None)
    history = sgd_model(make_mlp()).fit(
        dl_train, dl_val, epochs=3, verbose=0, ckpt_path=ckpt, resume=True, callbacks=[yours]
    )
    assert interrupted == [str(ckpt) + ".state"]
    assert len(history) == 1  # stopped by the Ctrl-C, after the write
    assert load_state_file(str(ckpt) + ".state")["epoch"] == 1
    assert not list(tmp_path.glob(".*.tmp"))

    monkeypatch.setattr(state_files, "atomic_write", real_atomic_write)
    trained = []
    counter = kt.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: trained.append(epoch))
    history = sgd_model(make_mlp()).fit(
        dl_train, dl_val, epochs=2, verbose=0, ckpt_path=ckpt, resume=True, callbacks=[counter]
    )
    assert trained == [2]
    assert history["epoch"].tolist() == [1, 2]


@pytest.mark.parametrize("presses", [1, 2])
def test_a_ctrl_c_during_a_write_is_raised_once_the_file_is_whole_and_a_second_one_at_once(
    tmp_path, presses, python_handles_ctrl_c
):
    path = tmp_path / "weights.pt"
    path.write_bytes(b"previous")

    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(b"half")
            for _ in range(presses):
                os.kill(os.getpid(), signal.SIGINT)
            f.write(b" and the rest")

    with pytest.raises(KeyboardInterrupt):
        atomic_write(path, write)
    assert path.read_bytes() == (b"half and the rest" if presses == 1 else b"previous")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weights.pt"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the caller's handler is back


def test_a_write_that_fails_after_a_ctrl_c_raises_its_own_error(tmp_path, python_handles_ctrl_c):
    # A full disk during the write: its error is the one to see, not the Ctrl-C that came during it.
    path = tmp_path / "weights.pt"
    path.write_bytes(b"previous")

    def write(tmp):
        os.kill(os.getpid(), signal.SIGINT)
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left on device"):
        atomic_write(path, write)
    assert path.read_bytes() == b"previous"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
