"""The files kerastorch writes atomically (best weights, training states, ModelCheckpoint files,
``save_ckpt``) come out as a plain ``open`` would make them, and a write the run was stopped in
leaves nothing behind for long."""

from __future__ import annotations

import os
import stat

import pytest
import torch
from torch import nn

import kerastorch as kt
from conftest import make_mlp


def sgd_model(net):
    return kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))


def mode_of(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


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


def test_a_run_removes_the_temporary_files_a_killed_write_left_beside_its_files(loaders, tmp_path):
    """A ``kill -9`` in the middle of a write leaves ``.<name>.<random>.tmp`` as large as the file;
    the next run that writes there removes it, also without ``resume``."""
    dl_train, dl_val = loaders
    left = [".best.pt.0f3a9c2e.tmp", ".e7-0.31.pt.77aa01bc.tmp", ".last.pt.1234abcd.tmp"]
    kept = [".best.pt.notes", ".other.pt.0f3a9c2e.tmp", "e7-0.31.pt"]  # not a write of these paths
    for name in left + kept:
        (tmp_path / name).write_bytes(b"\0" * 1000)
    callbacks = [
        kt.callbacks.ModelCheckpoint(str(tmp_path / "e{epoch}-{val_loss:.2f}.pt")),
        kt.callbacks.ModelCheckpoint(str(tmp_path / "last.pt")),
    ]
    sgd_model(make_mlp()).fit(
        dl_train, dl_val, epochs=1, verbose=0, ckpt_path=tmp_path / "best.pt", callbacks=callbacks
    )
    names = sorted(p.name for p in tmp_path.iterdir())
    assert not set(left) & set(names)
    assert set(kept) <= set(names)
