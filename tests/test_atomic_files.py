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
