"""The paths a run writes to (``ckpt_path``, ``ModelCheckpoint``, ``CSVLogger``, ``BackupAndRestore``)
are checked before the first batch: a path that cannot be written fails ``fit`` with the weights as
they were and nothing on disk, not after an epoch of training."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import kerastorch as kt
from conftest import make_mlp
from helpers import ran_where_file_modes_bind


def sgd_model():
    net = make_mlp()
    return kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))


def weights(model):
    return {k: v.clone() for k, v in model.net.state_dict().items()}


def refused_before_training(loaders, match, **fit_options):
    model = sgd_model()
    before = weights(model)
    with pytest.raises(ValueError, match=match):
        model.fit(*loaders, epochs=2, verbose=0, **fit_options)
    assert all(torch.equal(before[k], v) for k, v in model.net.state_dict().items())


def files_under(folder) -> list[str]:
    return sorted(os.path.relpath(os.path.join(root, f), folder) for root, _, files in os.walk(folder) for f in files)


@pytest.fixture
def read_only_folder(tmp_path):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        (folder / "probe").write_bytes(b"")
    except PermissionError:
        pass
    else:  # root, with its override of file modes, writes anyway (see ran_where_file_modes_bind)
        (folder / "probe").unlink()
        folder.chmod(0o755)
        pytest.fail("this process writes into read-only folders: run the test with ran_where_file_modes_bind")
    yield folder
    folder.chmod(0o755)


def test_a_path_ending_with_a_separator_is_refused_as_a_folder(loaders, tmp_path):
    refused_before_training(
        loaders, r"ckpt_path='.*runs/' ends with '/', so it names a folder", ckpt_path=f"{tmp_path}/runs/"
    )
    refused_before_training(
        loaders, r"CSVLogger filename '.*logs/' ends with '/'", callbacks=[kt.callbacks.CSVLogger(f"{tmp_path}/logs/")]
    )
    with pytest.raises(ValueError, match=r"ModelCheckpoint filepath '.*ckpt/' ends with '/'"):
        kt.callbacks.ModelCheckpoint(f"{tmp_path}/ckpt/")
    assert list(tmp_path.iterdir()) == []


# In a read-only folder as root, the test runs again in a child process (a few seconds): in the full run only.
@pytest.mark.parametrize("where", ["under a file", pytest.param("in a read-only folder", marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    "callback, named",
    [
        (lambda folder: kt.callbacks.CSVLogger(folder / "history.csv"), "CSVLogger filename '.*history.csv'"),
        (lambda folder: kt.callbacks.BackupAndRestore(folder / "backup"), r"BackupAndRestore\(backup_dir='.*backup'\)"),
    ],
    ids=["CSVLogger", "BackupAndRestore"],
)
def test_a_callback_that_cannot_write_its_file_fails_before_training(
    loaders, tmp_path, where, callback, named, request
):
    if where == "in a read-only folder" and ran_where_file_modes_bind(request):
        return
    if where == "under a file":
        folder = tmp_path / "file"
        folder.write_text("in the way")
    else:
        folder = request.getfixturevalue("read_only_folder")
    refused_before_training(loaders, f"{named} cannot be written", callbacks=[callback(folder)])
    assert files_under(tmp_path) == (["file"] if where == "under a file" else [])


def test_a_model_checkpoint_template_that_cannot_format_a_value_fails_before_training(loaders, tmp_path):
    template = str(tmp_path / "ck-{epoch}-{val_loss:02d}.pt")
    refused_before_training(
        loaders,
        r"cannot be formatted \(Unknown format code 'd' for object of type 'float'\).*\{val_loss:\.3f\}",
        callbacks=[kt.callbacks.ModelCheckpoint(template)],
    )
    assert list(tmp_path.iterdir()) == []
    # Formats a float takes, and an int's for the epoch, are fine.
    fine = kt.callbacks.ModelCheckpoint(str(tmp_path / "ck-{epoch:02d}-{val_loss:.2e}.pt"))
    sgd_model().fit(*loaders, epochs=1, verbose=0, callbacks=[fine])
    assert [p.name.startswith("ck-01-") for p in tmp_path.iterdir()] == [True]
