"""Checkpoints and training states are read without running code stored in them."""

from __future__ import annotations

import os
import pickle
import shlex

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from kerastorch.files.state import load_state_file, training_state_path
from kerastorch.files.weights import load_weights


class RunsACommand:
    """Unpickling this runs a shell command that creates ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {shlex.quote(self.marker)}",)


def crafted_files(folder, marker) -> dict[str, str]:
    """A bare pickle and a torch.save zip, each carrying the command."""
    bare = os.path.join(folder, "bare.pkl")
    with open(bare, "wb") as f:
        pickle.dump({"weight": torch.zeros(2), "payload": RunsACommand(marker)}, f)
    zipped = os.path.join(folder, "zipped.pt")
    torch.save({"0.weight": torch.zeros(2, 2), "payload": RunsACommand(marker)}, zipped)
    return {"bare pickle": bare, "torch.save zip": zipped}


def test_the_crafted_files_really_run_the_command_when_unpickled_unsafely(tmp_path):
    marker = tmp_path / "ran"
    for name, path in crafted_files(tmp_path, marker).items():
        if name == "bare pickle":
            with open(path, "rb") as f:
                pickle.load(f)
        else:
            torch.load(path, weights_only=False)
        assert marker.exists(), name  # so the tests below would notice a load that runs it
        marker.unlink()


def tiny_model():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 2))
    return kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("kind", ["bare pickle", "torch.save zip"])
def test_load_ckpt_refuses_a_crafted_pickle_and_runs_nothing(tmp_path, kind):
    marker = tmp_path / "ran"
    path = crafted_files(tmp_path, marker)[kind]
    model = tiny_model()
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    with pytest.raises(ValueError, match="was not loaded .loading it could run code stored in it"):
        model.load_ckpt(path)
    with pytest.raises(ValueError):
        load_weights(path)
    assert not marker.exists()
    assert all(torch.equal(before[k], v) for k, v in model.net.state_dict().items())


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
@pytest.mark.parametrize("kind", ["bare pickle", "torch.save zip"])
def test_resume_refuses_a_crafted_training_state_and_runs_nothing(tmp_path, kind):
    marker = tmp_path / "ran"
    crafted = crafted_files(tmp_path, marker)[kind]
    ckpt = tmp_path / "best.safetensors"
    os.replace(crafted, training_state_path(ckpt))
    model = tiny_model()
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    x, y = torch.randn(8, 4), torch.randint(0, 2, (8,))
    with pytest.raises(
        ValueError,
        match=r"best\.safetensors\.state' could not be read as a training state, so it was "
        r"not loaded .*never code stored in the file",
    ):
        model.fit(DataLoader(TensorDataset(x, y), batch_size=4), epochs=1, verbose=0, ckpt_path=ckpt, resume=True)
    with pytest.raises(ValueError):
        load_state_file(training_state_path(ckpt))
    assert not marker.exists()
    assert all(torch.equal(before[k], v) for k, v in model.net.state_dict().items())


def test_a_state_with_an_object_in_it_is_never_written(tmp_path):
    from kerastorch.files.state import save_state_file

    with pytest.raises(TypeError, match=r"state\['extra'\]\[0\] is a RunsACommand"):
        save_state_file({"epoch": 1, "extra": [RunsACommand(tmp_path / "ran")]}, tmp_path / "s.state")
    assert os.listdir(tmp_path) == []
