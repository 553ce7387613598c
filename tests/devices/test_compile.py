"""fit(compile=True): the same training as eager within float tolerance, the module's own keys
in every checkpoint, the user's module object back afterwards, and bad values refused."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from kerastorch.files.weights import load_weights


def _data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=generator)
    y = (x[:, :4].sum(dim=1) > 0).long()
    return DataLoader(TensorDataset(x[:192], y[:192]), batch_size=32), DataLoader(
        TensorDataset(x[192:], y[192:]), batch_size=32
    )


def _train(tmp_path, name, compile):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    model = kt.KerasModel(net, loss_fn=nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    dl_train, dl_val = _data()
    ckpt = tmp_path / f"{name}.safetensors"
    history = model.fit(dl_train, dl_val, epochs=3, verbose=0, accelerator="cpu", ckpt_path=str(ckpt), compile=compile)
    return net, model, history, ckpt


@pytest.mark.slow
def test_compile_trains_like_eager_and_saves_clean_keys(tmp_path):
    eager_net, _, eager_history, _ = _train(tmp_path, "eager", False)
    net, model, history, ckpt = _train(tmp_path, "compiled", True)
    assert model.net is net  # the user's module object again, not the OptimizedModule
    assert history["train_loss"].tolist() == pytest.approx(eager_history["train_loss"].tolist(), rel=1e-4)
    assert history["val_loss"].tolist() == pytest.approx(eager_history["val_loss"].tolist(), rel=1e-4)
    saved = load_weights(str(ckpt))
    assert sorted(saved) == sorted(net.state_dict())  # no "_orig_mod." prefix
    for key, tensor in eager_net.state_dict().items():
        torch.testing.assert_close(net.state_dict()[key], tensor, rtol=1e-4, atol=1e-5)


def test_compile_value_refused_before_training():
    net = nn.Linear(8, 2)
    before = net.weight.detach().clone()
    model = kt.KerasModel(net, loss_fn=nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    dl_train, _ = _data()
    with pytest.raises(ValueError, match="compile=.*expected True, False, 'strict'"):
        model.fit(dl_train, epochs=1, verbose=0, accelerator="cpu", compile="fast")
    assert torch.equal(net.weight, before)


def test_bad_compile_option_warns_and_trains_eagerly():
    net = nn.Linear(8, 2)
    model = kt.KerasModel(net, loss_fn=nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    dl_train, _ = _data()
    with pytest.warns(UserWarning, match="torch.compile failed"):
        history = model.fit(dl_train, epochs=1, verbose=0, accelerator="cpu", compile={"mode": "no-such-mode"})
    assert len(history) == 1 and model.net is net
    with pytest.raises(RuntimeError, match="torch.compile failed"):
        model.fit(dl_train, epochs=1, verbose=0, accelerator="cpu", compile={"mode": "no-such-mode", "strict": True})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="compile on CUDA needs a GPU")
def test_compile_on_cuda_trains():
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    model = kt.KerasModel(net, loss_fn=nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    dl_train, dl_val = _data()
    history = model.fit(dl_train, dl_val, epochs=2, verbose=0, accelerator="cuda", devices=1, compile=True)
    assert len(history) == 2 and model.net is net
