"""Bad input is refused before any weight changes, with a message that says what to fix.

Each case builds a fresh model, makes one beginner's mistake and checks the message,
that the net's weights are exactly as before and that the optimizer never stepped.
"""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from helpers import accuracy

torch.manual_seed(0)
X, Y = torch.randn(32, 4), torch.randint(0, 3, (32,))


def loader(x=X, y=Y, **kwargs):
    return DataLoader(TensorDataset(x, y), batch_size=8, **kwargs)


def make_model(loss_fn=nn.CrossEntropyLoss(), optimizer=None, lr_scheduler=None) -> kt.KerasModel:
    """``optimizer`` and ``lr_scheduler``, if given, are functions of the net that build them."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(0.2), nn.Linear(8, 3))
    opt = optimizer(net) if optimizer else torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    return kt.KerasModel(net, loss_fn, {"acc": accuracy}, opt, lr_scheduler(net) if lr_scheduler else None)


def fit_with(model_overrides=None, **fit_arguments):
    """Returns a function that builds the model, makes the mistake and returns the model."""

    def run(state):
        model = make_model(**(model_overrides or {}))
        state["model"] = model
        state["before"] = {k: v.clone() for k, v in model.net.state_dict().items()}
        arguments = {"train_data": loader(), "verbose": 0, **fit_arguments}
        model.fit(**arguments)

    return run


CASES = [
    pytest.param(
        fit_with(val_data=loader(), monitor="val_accuracy"),
        ValueError,
        r"monitor='val_accuracy' is not a value this run produces; available: train_loss, train_acc, lr, "
        r"val_loss, val_acc\. Did you mean 'val_acc'\?",
        id="wrong monitor",
    ),
    pytest.param(
        fit_with(val_data=loader(), mode="maximum"),
        ValueError,
        r"mode='maximum' is not supported; use 'min' .*, 'max' .*, or 'auto'",
        id="mode not min/max",
    ),
    pytest.param(
        fit_with(monitor="val_acc"),
        ValueError,
        r"monitor='val_acc' needs validation data, but val_data is None\. Pass val_data=\.\.\., or monitor "
        r"one of: train_loss, train_acc, lr\.",
        id="val monitor without val_data",
    ),
    pytest.param(fit_with(epochs=-1), ValueError, r"epochs=-1 must be a whole number >= 0", id="epochs < 0"),
    pytest.param(fit_with(epochs=2.5), ValueError, r"epochs=2\.5 must be a whole number >= 0", id="epochs not whole"),
    pytest.param(
        fit_with(patience=-1),
        ValueError,
        r"patience=-1 must be a whole number >= 0 \(or patience=None to never stop early\)",
        id="patience < 0",
    ),
    pytest.param(
        fit_with(patience="5"),
        TypeError,
        r"^patience='5' is a string, but it must be a whole number of epochs >= 0 \(or patience=None to never stop "
        r"early\): patience=5\.$",
        id="patience a string of digits, by name",
    ),
    pytest.param(
        fit_with(patience="best.pt"),
        TypeError,
        r"patience='best\.pt' looks like a file path\..*ckpt_path='best\.pt'",
        id="patience a path",
    ),
    pytest.param(
        fit_with(gradient_accumulation_steps=0),
        ValueError,
        r"gradient_accumulation_steps=0 must be a whole number >= 1",
        id="accumulation < 1",
    ),
    pytest.param(
        fit_with(precision="half"),
        ValueError,
        r"precision='half' is not supported; use '32-true', '16-mixed'",
        id="unknown precision",
    ),
    pytest.param(
        fit_with(accelerator="tpu"),
        ValueError,
        r"accelerator='tpu' is not known; use one of 'auto', 'cpu', 'gpu', 'cuda', 'mps'",
        id="unknown accelerator",
    ),
    pytest.param(
        fit_with(train_data=loader(X[:0], Y[:0])),
        ValueError,
        r"train_data is empty \(0 batches\)\. Check the dataset's size, batch_size and drop_last",
        id="empty DataLoader",
    ),
    pytest.param(
        fit_with(train_data=TensorDataset(X[:0], Y[:0])),
        ValueError,
        r"train_data is empty \(a TensorDataset of 0 samples\)\. Check how the dataset was built: its len\(\) is 0",
        id="empty Dataset",
    ),
    pytest.param(
        fit_with(val_data=loader(X[:4], Y[:4], drop_last=True)),
        ValueError,
        r"val_data is empty \(0 batches\)",
        id="empty val DataLoader",
    ),
    pytest.param(
        fit_with(train_data=5),
        TypeError,
        r"train_data is a int, but it must be an iterable of batches, such as "
        r"torch\.utils\.data\.DataLoader\(TensorDataset\(x, y\), batch_size=32\)",
        id="not iterable",
    ),
    pytest.param(
        fit_with(train_data=X),
        ValueError,
        r"train_data is a single array: its labels are missing\. Pass fit\(X, y\), or a tuple \(X, y\)",
        id="a tensor without labels",
    ),
    pytest.param(
        fit_with(train_data=X.numpy()),
        ValueError,
        r"train_data is a single array: its labels are missing",
        id="a numpy array without labels",
    ),
    pytest.param(
        fit_with(train_data=DataLoader(TensorDataset(X), batch_size=8)),
        ValueError,
        r"Got a list of length 1 as a batch, which has no labels\. kerastorch expects a tuple \(x, y\)",
        id="batches without labels",
    ),
    pytest.param(
        fit_with(train_data=loader(Y.float().unsqueeze(1).repeat(1, 4), Y.float())),
        RuntimeError,
        r"The first batch of train_data failed in the loss \(CrossEntropyLoss\(\)\), before training started "
        r"\(nothing has changed\): expected target dtype to be Long",
        id="float labels for a class loss",
    ),
    pytest.param(
        fit_with(train_data=loader(torch.randn(32, 5), Y)),
        RuntimeError,
        r"The first batch of train_data failed inside the net, in its module '0' \(Linear\(in_features=4, "
        r"out_features=8, bias=True\)\), before training started \(nothing has changed\): mat1 and mat2 shapes "
        r"cannot be multiplied",
        id="features of the wrong size",
    ),
    pytest.param(
        fit_with({"loss_fn": None}),
        ValueError,
        r"KerasModel has no loss_fn\. Pass one, e\.g\. KerasModel\(net, loss_fn=nn\.CrossEntropyLoss\(\)\)",
        id="no loss_fn",
    ),
    pytest.param(
        fit_with({"loss_fn": nn.CrossEntropyLoss}),
        TypeError,
        r"loss_fn is the class CrossEntropyLoss, not a loss\. Pass an instance: loss_fn=nn\.CrossEntropyLoss\(\)",
        id="loss class, not instance",
    ),
    pytest.param(
        fit_with({"optimizer": lambda net: torch.optim.Adam}),
        TypeError,
        r"optimizer is the class Adam, not an optimizer\. Build one over the net's parameters: "
        r"optimizer=torch\.optim\.Adam\(net\.parameters\(\), lr=1e-3\)",
        id="optimizer class, not instance",
    ),
    pytest.param(
        fit_with({"optimizer": lambda net: torch.optim.Adam(nn.Linear(4, 3).parameters())}),
        ValueError,
        r"The optimizer updates none of the net's parameters.*built for another net",
        id="optimizer of another net",
    ),
    pytest.param(
        fit_with({"optimizer": lambda net: torch.optim.SGD(net.requires_grad_(False).parameters(), lr=0.1)}),
        ValueError,
        r"No parameter of the net requires grad: all 6 are frozen \(requires_grad=False\).*Unfreeze the ones to "
        r"train.*torch\.optim\.Adam\(\[p for p in net\.parameters\(\) if p\.requires_grad\], lr=1e-3\)",
        id="frozen net",
    ),
    pytest.param(
        fit_with({"lr_scheduler": lambda net: torch.optim.lr_scheduler.StepLR}),
        TypeError,
        r"lr_scheduler is the class StepLR, not a scheduler",
        id="scheduler class, not instance",
    ),
    pytest.param(
        fit_with(
            {
                "lr_scheduler": lambda net: torch.optim.lr_scheduler.StepLR(
                    torch.optim.SGD(net.parameters(), lr=0.1), step_size=1
                )
            }
        ),
        ValueError,
        r"The lr_scheduler drives another optimizer than the model's",
        id="scheduler of another optimizer",
    ),
    pytest.param(
        fit_with(ckpt_path=os.path.join(__file__, "best.safetensors")),
        ValueError,
        r"ckpt_path='.*test_bad_input\.py/best\.safetensors' cannot be written: '.*test_bad_input\.py' is a file, so it "
        r"cannot hold a folder",
        id="ckpt_path cannot be written",
    ),
    pytest.param(fit_with(ckpt_path=3), TypeError, r"ckpt_path=3 must be a file path", id="ckpt_path not a path"),
    pytest.param(
        fit_with(resume=True),
        ValueError,
        r"resume=True needs a ckpt_path.*fit\(\.\.\., ckpt_path='runs/best\.safetensors', resume=True\)",
        id="resume without ckpt_path",
    ),
    pytest.param(
        fit_with(resume="yes", ckpt_path="unused.safetensors"),
        TypeError,
        r"resume='yes' must be True or False",
        id="resume not a bool",
    ),
    pytest.param(
        fit_with(gradient_clip_val=-1.0),
        ValueError,
        r"gradient_clip_val=-1\.0 must be a positive number",
        id="negative clip value",
    ),
    pytest.param(
        fit_with(val_data=loader(), min_delta=float("nan")),
        ValueError,
        r"min_delta=nan is not a number, and every comparison with it is False",
        id="min_delta NaN",
    ),
    pytest.param(
        fit_with(verbose=5),
        ValueError,
        r"verbose=5; use 0 \(silent\), 1 \(progress bars\) or 2",
        id="verbose not 0/1/2",
    ),
    pytest.param(
        fit_with(callbacks=kt.callbacks.EarlyStopping()),
        TypeError,
        r"callbacks is a EarlyStopping, but it must be a list of callbacks",
        id="one callback, not a list",
    ),
    pytest.param(
        fit_with(callbacks=[print]),
        TypeError,
        r"callbacks holds a builtin_function_or_method, which is not a kerastorch Callback",
        id="not a Callback",
    ),
]


@pytest.mark.parametrize("make_mistake, error, message", CASES)
def test_bad_input_is_refused_before_any_weight_changes(make_mistake, error, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    state = {}
    with pytest.raises(error, match=message):
        make_mistake(state)
    model = state["model"]
    after = model.net.state_dict()
    assert all(torch.equal(state["before"][k], after[k]) for k in after)  # BatchNorm's running stats included
    optimizer = model.optimizer
    if isinstance(optimizer, torch.optim.Optimizer):
        assert not optimizer.state  # no step was taken
    assert os.listdir(tmp_path) == []  # nothing left on disk


@pytest.mark.parametrize(
    "metrics_dict, message",
    [
        (
            {"acc": "accuracy"},
            r"metrics_dict\['acc'\] is a str, which cannot be called\. A metric is a torchmetrics Metric",
        ),
        (["acc"], r"metrics_dict is a list, but it must be a dict of name -> metric"),
    ],
    ids=["metric not callable", "metrics not a dict"],
)
def test_a_bad_metric_is_refused_when_the_model_is_built(metrics_dict, message):
    net = nn.Linear(4, 3)
    with pytest.raises(TypeError, match=message):
        kt.KerasModel(net, nn.CrossEntropyLoss(), metrics_dict, torch.optim.SGD(net.parameters(), lr=0.1))


def test_a_mode_against_the_metrics_own_direction_is_warned_of():
    torchmetrics = pytest.importorskip("torchmetrics")
    torch.manual_seed(0)
    net = nn.Linear(4, 3)
    accuracy_metric = torchmetrics.Accuracy(task="multiclass", num_classes=3)
    model = kt.KerasModel(
        net, nn.CrossEntropyLoss(), {"acc": accuracy_metric}, torch.optim.SGD(net.parameters(), lr=0.5)
    )
    with pytest.warns(
        UserWarning,
        match=r"mode='min' for val_acc, but its metric MulticlassAccuracy says higher_is_better=True.*mode='max'",
    ):
        history = model.fit(loader(), loader(), epochs=3, monitor="val_acc", mode="min", patience=None, verbose=0)
    assert len(history) == 3  # a warning: Keras takes any mode
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the metric's own direction, or auto, says nothing
        model.fit(loader(), loader(), epochs=1, monitor="val_acc", mode="max", verbose=0)
        model.fit(loader(), loader(), epochs=1, monitor="val_acc", verbose=0)


# -- the first batch fails in torch: the message names the cause, not the place of the labels ------------


class NumpyBatches:
    """An iterable of NumPy batches of the user's own (a Keras Sequence): its batches go to the net as they are."""

    def __iter__(self):
        return iter([(X[i : i + 8].numpy(), Y[i : i + 8].numpy()) for i in range(0, 32, 8)])


def embedding_then_linear() -> nn.Module:
    return nn.Sequential(nn.Embedding(10, 2), nn.Flatten(), nn.Linear(8, 3))


@pytest.mark.parametrize(
    "train_data, net, said",
    [
        (
            loader(X, Y.float()),
            None,
            [
                "but got Float. kerastorch called net(batch[0])",
                "The labels are float32 class ids (",
                "y.long() for tensors or y.astype('int64') for NumPy and pandas",
            ],
        ),
        (loader(X, Y > 0), None, ["The labels are bool (True/False)", "y.long()"]),
        (
            loader(X, Y.float() / 4),
            None,
            ["float32 numbers that are not whole (", "a regression loss, e.g. nn.MSELoss()"],
        ),
        (
            loader(X, Y[:, None]),
            None,
            [
                "The labels have shape (8, 1), but CrossEntropyLoss takes one class id per sample, shape (8,)",
                "y.squeeze(1)",
            ],
        ),
        (
            NumpyBatches(),
            None,
            ["must be Tensor, not numpy.ndarray. kerastorch", "The batch holds NumPy arrays", "list(batches)"],
        ),
        (
            loader((X * 10).long(), Y),
            None,
            [
                "but got Long and Float. kerastorch",
                "The inputs are int64 but the net's weights are float32",
                "X.astype('float32')",
            ],
        ),
        # Token ids into an embedding are right: the net's own layer failed, and the message names it.
        (
            loader(torch.randint(0, 10, (32, 5)), Y),
            embedding_then_linear,
            ["failed inside the net, in its module '2' (Linear(in_features=8, out_features=3", "int64 (8, 5)"],
        ),
    ],
    ids=[
        "float class ids",
        "bool labels",
        "fractions for CrossEntropyLoss",
        "labels (N, 1)",
        "NumPy batches of an iterable",
        "integer features",
        "embedding",
    ],
)
def test_a_first_batch_that_fails_in_torch_says_the_cause_and_the_fix(train_data, net, said):
    if net is None:
        model = make_model()
    else:
        built = net()
        model = kt.KerasModel(built, nn.CrossEntropyLoss(), {"acc": accuracy}, torch.optim.SGD(built.parameters(), 0.1))
    before = {k: v.clone() for k, v in model.net.state_dict().items()}
    with pytest.raises((RuntimeError, TypeError)) as caught:  # TypeError: torch's, for NumPy arrays
        model.fit(train_data, epochs=1, verbose=0)
    message = str(caught.value)
    for words in said:
        assert words in message, message
    assert "labels_at" not in message, message  # the place of the labels is not the cause
    assert all(torch.equal(before[k], v) for k, v in model.net.state_dict().items())
    assert not model.optimizer.state


def test_class_weight_for_a_class_at_every_pixel_points_to_the_losss_weight():
    torch.manual_seed(0)
    images = torch.randn(16, 1, 4, 4)
    masks = (images[:, 0] > 0.5).long()  # (N, H, W): a class for each pixel
    net = nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 2, 1))
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(net.parameters()))
    before = {k: v.clone() for k, v in net.state_dict().items()}
    with pytest.raises(ValueError) as caught:
        model.fit(images, masks, class_weight={0: 1.0, 1: 5.0}, epochs=1, verbose=0)
    message = str(caught.value)
    assert "shape (16, 4, 4): a class id for each pixel" in message, message
    assert "nn.CrossEntropyLoss(weight=torch.tensor([" in message and "pos_weight" not in message, message
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items()) and not model.optimizer.state
