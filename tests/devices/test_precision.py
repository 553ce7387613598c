"""Precision: every name and alias, real fits in each precision on the CPU, the visible
16-mixed fallback, two fits with different settings in one process, and clear errors.

The GPU tests at the end skip on a machine without CUDA.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import kerastorch as kt
from kerastorch.compat.arguments import precision_from_mixed_precision
from kerastorch.devices.words import PRECISIONS, parse_precision

HAS_CUDA = torch.cuda.device_count() > 0  # counted through NVML: does not initialise CUDA in this process


def needs_cuda(test):
    """A GPU test: marked `gpu`, skipped without CUDA."""
    return pytest.mark.gpu(pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")(test))


without_cuda = pytest.mark.skipif(HAS_CUDA, reason="checks the answer on a machine without CUDA")


@pytest.fixture
def loaders(digits8):
    torch.manual_seed(0)
    return DataLoader(digits8[0], batch_size=64, shuffle=True), DataLoader(digits8[1], batch_size=128)


def make_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


class DtypeSpy(nn.Module):
    """CrossEntropyLoss that remembers the dtype of the outputs it was given."""

    def __init__(self, **kwargs):
        super().__init__()
        self.loss = nn.CrossEntropyLoss(**kwargs)
        self.seen: set = set()

    def forward(self, preds, labels):
        self.seen.add(preds.dtype)
        return self.loss(preds, labels)


def numpy_accuracy(preds, labels):
    """A metric that only works on dtypes numpy has (not bfloat16), like many hand-written ones."""
    return torch.tensor((preds.cpu().numpy().argmax(1) == labels.cpu().numpy()).mean())


def fit(net, loaders, loss_fn=None, epochs=3, **kwargs):
    model = kt.KerasModel(
        net, loss_fn or DtypeSpy(), {"acc": numpy_accuracy}, torch.optim.Adam(net.parameters(), lr=1e-2)
    )
    history = model.fit(*loaders, epochs=epochs, patience=None, verbose=0, **kwargs)
    return model, history


def assert_learned(history):
    assert history["val_acc"].iloc[-1] > 0.8, history  # chance is 0.1
    assert history["train_loss"].iloc[-1] < history["train_loss"].iloc[0]


# -- the names -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given, canonical",
    [
        *[(p, p) for p in PRECISIONS],
        (32, "32-true"),
        ("32", "32-true"),
        (64, "64-true"),
        ("64", "64-true"),
        (16, "16-mixed"),
        ("16", "16-mixed"),
        ("bf16", "bf16-mixed"),
        (" BF16-Mixed ", "bf16-mixed"),
    ],
)
def test_every_name_and_alias(given, canonical):
    assert parse_precision(given) == canonical


@pytest.mark.parametrize(
    "mixed_precision, canonical", [("no", "32-true"), ("fp16", "16-mixed"), ("bf16", "bf16-mixed")]
)
def test_torchkeras_mixed_precision_words(mixed_precision, canonical):
    assert parse_precision(precision_from_mixed_precision("32-true", mixed_precision)) == canonical
    assert parse_precision(precision_from_mixed_precision(canonical, mixed_precision)) == canonical
    assert precision_from_mixed_precision(" BF16 ", None) == " BF16 "  # no mixed_precision: precision as given


@pytest.mark.parametrize("bad", ["fp16", "16-bit", 8, 32.0, True, None, [32], "transformer-engine"])
def test_invalid_precision_lists_the_allowed_values(bad):
    with pytest.raises(ValueError) as caught:
        parse_precision(bad)
    message = str(caught.value)
    assert all(repr(p) in message for p in PRECISIONS) and "'bf16'" in message


def test_invalid_or_conflicting_mixed_precision():
    with pytest.raises(ValueError, match="use 'no', 'fp16' or 'bf16'"):
        precision_from_mixed_precision("32-true", "fp8")
    with pytest.raises(ValueError, match="precision='64-true' and mixed_precision='bf16' disagree"):
        precision_from_mixed_precision("64-true", "bf16")
    with pytest.raises(ValueError, match="precision='fp16' is not supported"):
        precision_from_mixed_precision("fp16", "bf16")


# -- real fits on the CPU ----------------------------------------------------------------------


def test_32_true_trains_in_float32_and_says_so(loaders, capsys):
    net = make_mlp()
    model = kt.KerasModel(net, DtypeSpy(), {"acc": numpy_accuracy}, torch.optim.Adam(net.parameters(), lr=1e-2))
    history = model.fit(*loaders, epochs=3, patience=None, verbose=2, precision=32)
    assert_learned(history)
    assert model.loss_fn.seen == {torch.float32}
    assert f"training on {model.runtime.device} in precision 32-true" in capsys.readouterr().out


def test_64_true_trains_in_float64(loaders):
    net = make_mlp()
    weighted = DtypeSpy(weight=torch.ones(10))  # a float32 class-weight buffer must follow the net
    model, history = fit(net, loaders, loss_fn=weighted, precision="64-true")
    assert_learned(history)
    assert weighted.seen == {torch.float64}
    assert {p.dtype for p in net.parameters()} == {torch.float64}
    assert model.predict(loaders[1]).dtype == torch.float64
    assert model.evaluate(loaders[1], quiet=True)["val_acc"] == pytest.approx(history["val_acc"].max())


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16"])
def test_bf16_mixed_really_autocasts_on_the_cpu(loaders, precision):
    net = make_mlp()
    model, history = fit(net, loaders, precision=precision)
    assert_learned(history)  # the numpy metric got a dtype it accepts
    assert model.loss_fn.seen == {torch.bfloat16}
    assert {p.dtype for p in net.parameters()} == {torch.float32}  # mixed: the weights stay float32
    assert "forward" not in vars(net)  # no autocast wrapper left on the net
    assert net(torch.randn(2, 64)).dtype == torch.float32
    assert model.predict(loaders[1]).dtype == torch.float32


@without_cuda
@pytest.mark.parametrize("arguments", [{"precision": "16-mixed"}, {"precision": 16}, {"mixed_precision": "fp16"}])
def test_16_mixed_on_the_cpu_warns_and_runs_bf16(loaders, capsys, arguments):
    net = make_mlp()
    model = kt.KerasModel(net, DtypeSpy(), {"acc": numpy_accuracy}, torch.optim.Adam(net.parameters(), lr=1e-2))
    with pytest.warns(UserWarning, match="'16-mixed' is not supported on CPU.*running 'bf16-mixed' instead"):
        history = model.fit(*loaders, epochs=3, patience=None, verbose=2, **arguments)
    assert_learned(history)
    assert model.loss_fn.seen == {torch.bfloat16}  # never silently float32
    assert "in precision bf16-mixed" in capsys.readouterr().out


@pytest.mark.parametrize("precision, dtype", [("bf16-true", torch.bfloat16), ("16-true", torch.float16)])
def test_half_true_precisions_convert_the_net(loaders, precision, dtype):
    net = make_mlp()
    model = kt.KerasModel(
        net, DtypeSpy(), {"acc": numpy_accuracy}, torch.optim.Adam(net.parameters(), lr=1e-2, eps=1e-4)
    )  # 1e-8 is 0 in float16
    history = model.fit(*loaders, epochs=3, patience=None, verbose=0, precision=precision)
    assert_learned(history)
    assert model.loss_fn.seen == {dtype}
    assert {p.dtype for p in net.parameters()} == {dtype}
    assert model.predict(loaders[1]).dtype == torch.float32  # half outputs come back as float32


def test_16_true_warns_when_adam_eps_is_zero_in_float16(loaders):
    net = make_mlp()
    with pytest.warns(UserWarning, match=r"Adam\(eps=1e-08\): float16 rounds eps to 0.*eps=1e-4"):
        fit(net, loaders, epochs=1, precision="16-true")


def test_torchkeras_words_on_fit(loaders):
    net = make_mlp()
    model, history = fit(net, loaders, epochs=1, mixed_precision="bf16", cpu=True)
    assert model.loss_fn.seen == {torch.bfloat16} and model.runtime.device.type == "cpu"
    model, history = fit(make_mlp(), loaders, epochs=1, mixed_precision="no")
    assert model.loss_fn.seen == {torch.float32}


def test_two_fits_with_different_precisions_in_one_process(loaders):
    from accelerate.state import AcceleratorState

    net = make_mlp()
    model = kt.KerasModel(net, DtypeSpy(), {"acc": numpy_accuracy}, torch.optim.Adam(net.parameters(), lr=1e-2))
    first = model.fit(*loaders, epochs=2, patience=None, verbose=0, precision="64-true", accelerator="cpu")
    assert model.loss_fn.seen == {torch.float64}
    assert not AcceleratorState._shared_state  # fit left no accelerate state behind

    model.loss_fn.seen.clear()
    with pytest.warns(UserWarning, match="weights are float64.*converted to float32"):
        second = model.fit(*loaders, epochs=2, patience=None, verbose=0, precision="bf16-mixed", accelerator="auto")
    assert model.loss_fn.seen == {torch.bfloat16}  # autocast works: the weights are float32 again
    assert {p.dtype for p in net.parameters()} == {torch.float32}
    state = model.optimizer.state[next(net.parameters())]
    assert state["exp_avg"].dtype == torch.float32  # Adam's moments followed the weights

    model.loss_fn.seen.clear()
    third = model.fit(*loaders, epochs=1, patience=None, verbose=0, precision="32-true", devices=1)
    assert model.loss_fn.seen == {torch.float32}
    assert "forward" not in vars(net)
    assert second["val_loss"].min() <= first["val_loss"].min() + 0.05  # it went on learning
    assert third["val_acc"].iloc[-1] > 0.85


# -- errors before any weight changes -----------------------------------------------------------


@pytest.mark.parametrize(
    "arguments, error, words",
    [
        ({"precision": "half"}, ValueError, "'32-true', '16-mixed', 'bf16-mixed'"),
        ({"mixed_precision": "fp8"}, ValueError, "use 'no', 'fp16' or 'bf16'"),
        ({"accelerator": "tpu"}, ValueError, "use one of 'auto', 'cpu', 'gpu', 'cuda', 'mps'"),
        ({"devices": 1.5}, TypeError, "devices takes an int k"),
        ({"devices": [0, 0]}, ValueError, "more than once"),
        pytest.param({"accelerator": "gpu"}, RuntimeError, "no GPU that torch can use", marks=without_cuda),
        pytest.param(
            {"accelerator": "cuda", "devices": [0]},
            RuntimeError,
            "accelerator='cuda' was asked for",
            marks=without_cuda,
        ),
    ],
)
def test_bad_settings_fail_before_training(loaders, arguments, error, words):
    net = make_mlp()
    before = [p.detach().clone() for p in net.parameters()]
    with pytest.raises(error, match=words.replace("(", r"\(")):
        fit(net, loaders, epochs=1, **arguments)
    assert all(torch.equal(a, b) for a, b in zip(before, net.parameters()))


# -- on a GPU ---------------------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("devices", [1, [0], "0", "0,"])
def test_one_gpu(loaders, devices):
    net = make_mlp()
    model, history = fit(net, loaders, accelerator="gpu", devices=devices)
    assert_learned(history)
    assert next(net.parameters()).device == torch.device("cuda", 0)
    assert model.runtime.describe().startswith("kerastorch: training on cuda:0 (")


@needs_cuda
def test_16_mixed_on_a_gpu_uses_a_grad_scaler(loaders):
    net = make_mlp()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, history = fit(net, loaders, accelerator="cuda", devices=1, precision="16-mixed")
    assert not [w for w in caught if "16-mixed" in str(w.message)]  # no fallback on a GPU
    assert_learned(history)
    assert model.loss_fn.seen == {torch.float16}
    assert isinstance(model.runtime.scaler, torch.amp.GradScaler)
    assert model.runtime.scaler._scale is not None  # the scaler scaled the losses


@needs_cuda
def test_bf16_mixed_on_a_gpu(loaders):
    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bfloat16")
    net = make_mlp()
    model, history = fit(net, loaders, accelerator="cuda", precision="bf16-mixed")
    assert_learned(history)
    assert model.loss_fn.seen == {torch.bfloat16}
    assert model.runtime.scaler is None


@needs_cuda
def test_gpu_then_cpu_in_one_process(loaders):
    net = make_mlp()
    model, _ = fit(net, loaders, epochs=1, accelerator="cuda", precision="64-true")
    assert next(net.parameters()).device.type == "cuda"
    model.loss_fn.seen.clear()
    with pytest.warns(UserWarning, match="converted to float32"):
        history = model.fit(*loaders, epochs=2, patience=None, verbose=0, accelerator="cpu")
    assert next(net.parameters()).device.type == "cpu"
    assert model.loss_fn.seen == {torch.float32}
    assert_learned(history)
