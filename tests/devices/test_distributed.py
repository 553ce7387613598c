"""Several processes for real, on this CPU machine (gloo), and nets wrapped for several devices.

- fit(accelerator="cpu", devices=2) from this process forks two workers and hands back
  the history and the best weights; validation values are exact over an odd-sized set
  for every metric form; a stop asked by one process stops all; a worker's error is
  raised here with its traceback.
- Two torchrun "nodes" on loopback, one script, different seeds: identical results.
- DataParallel checkpoints hold the bare net's keys; model-parallel nets are detected.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, Subset

import kerastorch as kt
from helpers import TorchkerasAccuracy, accuracy
from kerastorch.data.batches import labels_to_outputs
from kerastorch.devices.launch import CUDA_BEFORE_FORK, WorkerTraceback, check_can_fork, record_failure, worker_failure
from kerastorch.examples import digits_datasets
from kerastorch.files.weights import load_weights
from kerastorch.strategies.model_parallel import input_device, is_model_parallel, output_device, parameter_devices

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_SCRIPT = os.path.join(REPO_ROOT, "tests", "distributed_train_script.py")


# -- metrics in the three forms users write, plus one that keeps a list -----------------


class ListMeanLoss:
    """A metric that keeps per-sample values in a list (like an AUC), concatenated in compute."""

    def __init__(self):
        self.values = []

    def update(self, preds, labels):
        self.values.append(nn.functional.cross_entropy(preds, labels, reduction="none"))

    def compute(self):
        return torch.cat(self.values).mean()

    def reset(self):
        self.values = []

    __call__ = update


def all_metric_forms() -> dict:
    return {
        "tm_acc": torchmetrics.Accuracy(task="multiclass", num_classes=10),
        "module_acc": TorchkerasAccuracy(),
        "fn_acc": accuracy,
        "list_ce": ListMeanLoss(),
    }


class StopOnMainProcess(kt.Callback):
    """Asks to stop on the main process only: every process must stop with it."""

    def __init__(self, epoch: int):
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if self.model.is_main_process and epoch == self.epoch:
            self.model.stop_training = True


class ReadsRunningValues(kt.Callback):
    """Reads the running values on the main process alone, as the progress bar does: must not wait for the others."""

    def __init__(self):
        self.reads = 0

    def on_train_batch_end(self, batch, logs=None):
        if self.model.is_main_process:
            assert logs["train_tm_acc"] >= 0 and logs["train_module_acc"] >= 0 and logs["train_list_ce"] >= 0
            self.reads += 1


class FailsOnRankOne(kt.Callback):
    def on_epoch_end(self, epoch, logs=None):
        if os.environ.get("RANK") == "1":
            raise ValueError("rank one cannot go on")


def small_mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


@pytest.fixture(scope="module")
def digits():
    ds_train, ds_val, _ = digits_datasets(size=8)
    # 101 validation samples in batches of 16: 7 batches, 4 for one process and 3 for the other,
    # the last one short. Any padding or double counting would change the values.
    return DataLoader(ds_train, batch_size=64, shuffle=True), DataLoader(Subset(ds_val, range(101)), batch_size=16)


@pytest.mark.slow
def test_fit_on_two_cpu_processes_returns_history_and_best_weights(digits, tmp_path):
    dl_train, dl_val = digits
    torch.manual_seed(0)
    net = small_mlp()
    initial = {k: v.clone() for k, v in net.state_dict().items()}
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), all_metric_forms(), torch.optim.Adam(net.parameters(), lr=1e-2))
    ckpt = tmp_path / "best.safetensors"

    history = model.fit(
        dl_train,
        dl_val,
        epochs=8,
        patience=None,
        monitor="val_tm_acc",
        mode="max",
        ckpt_path=ckpt,
        accelerator="cpu",
        devices=2,
        verbose=0,
        callbacks=[StopOnMainProcess(epoch=4), ReadsRunningValues()],
    )

    assert list(history["epoch"]) == [1, 2, 3, 4]  # one process asked to stop; both did
    assert history is model.history
    assert history["val_loss"].iloc[-1] < history["val_loss"].iloc[0]  # it learned
    assert not all(torch.equal(initial[k], v) for k, v in net.state_dict().items())
    assert model.optimizer.state  # the optimizer's state came back too
    # The caller's net holds the best epoch's weights, which the main process also wrote once.
    best = int(history["val_tm_acc"].idxmax())
    saved = load_weights(ckpt)
    assert all(torch.equal(saved[k], v) for k, v in net.state_dict().items())
    # Validation over 101 samples split unevenly over 2 processes equals one process's evaluation.
    single = model.evaluate(dl_val, quiet=True)
    for name in ["val_loss", "val_tm_acc", "val_module_acc", "val_fn_acc", "val_list_ce"]:
        assert history[name].iloc[best] == pytest.approx(single[name], rel=1e-6, abs=1e-9), name
    assert single["val_tm_acc"] == single["val_module_acc"] == pytest.approx(single["val_fn_acc"])
    assert round(single["val_tm_acc"] * 101) == pytest.approx(single["val_tm_acc"] * 101)


@pytest.mark.slow
def test_a_validation_loader_that_drops_its_last_batch_is_validated_on_every_whole_batch(digits):
    # 117 samples in batches of 16 with drop_last=True: 7 whole batches, which one process
    # validates. Two processes must too: accelerate would also drop the 7th, which has no partner.
    dl_train, _ = digits
    _, ds_val, _ = digits_datasets(size=8)
    dl_val = DataLoader(Subset(ds_val, range(117)), batch_size=16, drop_last=True)
    torch.manual_seed(0)
    net = small_mlp()
    metrics = {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)}
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), metrics, torch.optim.Adam(net.parameters(), lr=1e-2))
    history = model.fit(dl_train, dl_val, epochs=2, monitor="val_acc", accelerator="cpu", devices=2, verbose=0)
    single = model.evaluate(dl_val, quiet=True)
    best = int(history["val_acc"].idxmax())
    assert history["val_loss"].iloc[best] == pytest.approx(single["val_loss"], rel=1e-6)
    assert history["val_acc"].iloc[best] == pytest.approx(single["val_acc"])
    assert round(single["val_acc"] * 112) == pytest.approx(single["val_acc"] * 112)  # over 7 batches of 16


@pytest.mark.slow
def test_a_lazy_net_sized_by_its_first_batch_trains_over_two_processes():
    """``nn.LazyLinear`` (Keras's ``Dense(16)``): each worker sizes its copy on its first batch, before
    the net is wrapped for the exchange of gradients; the caller gets the sized best weights, and its
    optimizer still holds the net's parameters, so a later fit here goes on training."""
    torch.manual_seed(0)
    x = torch.randn(512, 8)
    y = (x[:, 0] > 0).long()
    dl_train = DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True)
    dl_val = DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=64)
    net = nn.Sequential(nn.LazyLinear(16), nn.ReLU(), nn.LazyLinear(2))
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), {"acc": accuracy}, torch.optim.Adam(net.parameters(), lr=1e-2))
    history = model.fit(dl_train, dl_val, epochs=4, accelerator="cpu", devices=2, verbose=0)
    assert net[0].weight.shape == (16, 8) and net[2].weight.shape == (2, 16)
    assert history["val_acc"].max() > 0.9
    assert model.evaluate(dl_val, quiet=True)["val_loss"] == pytest.approx(history["val_loss"].min(), rel=1e-6)
    assert model.optimizer.param_groups[0]["params"][0] is net[0].weight
    before = net[0].weight.detach().clone()
    again = model.fit(dl_train, dl_val, epochs=1, verbose=0)
    assert not torch.equal(before, net[0].weight) and again["val_loss"][0] < history["val_loss"].iloc[0]


@pytest.mark.slow
def test_an_error_in_a_worker_is_raised_in_the_caller_with_its_traceback(digits):
    dl_train, dl_val = digits
    net = small_mlp()
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), {}, torch.optim.SGD(net.parameters(), lr=0.1))
    before = {k: v.clone() for k, v in net.state_dict().items()}

    with pytest.raises(ValueError, match="rank one cannot go on") as caught:
        model.fit(dl_train, dl_val, epochs=2, accelerator="cpu", devices=2, verbose=0, callbacks=[FailsOnRankOne()])

    cause = caught.value.__cause__
    assert isinstance(cause, WorkerTraceback)
    assert "rank 1" in str(cause) and "in on_epoch_end" in str(cause)  # where in the worker it failed
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())  # the caller's net is untouched


def test_cuda_initialised_before_a_multi_gpu_fit_is_a_clear_error(monkeypatch, tmp_path):
    # No GPU here: pretend CUDA was initialised, as `.cuda()` in a notebook cell would have done.
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeError, match="Restart the kernel") as caught:
        check_can_fork(2, "cuda")
    assert "fit(devices=2)" in str(caught.value) and "accelerate launch" in str(caught.value)
    check_can_fork(2, "cpu")  # CPU workers do not use CUDA: fine

    # The same message when a worker found CUDA poisoned (torch.cuda.is_available() before the fork).
    try:
        raise RuntimeError("CUDA error: initialization error")
    except RuntimeError as error:
        record_failure(str(tmp_path), 0, error)
    raised = worker_failure(str(tmp_path), RuntimeError("launch failed"), 2)
    assert str(raised) == CUDA_BEFORE_FORK.format(k=2)
    assert "initialization error" in str(raised.__cause__)


NOTEBOOK_CELLS = [
    # The kernel imports this checkout's kerastorch; the workers fit forks inherit that.
    f"import sys; sys.path.insert(0, {REPO_ROOT!r})",
    """import torch, torchmetrics
from torch import nn
import kerastorch as kt
from kerastorch.examples import digits_loaders
dl_train, dl_val, _ = digits_loaders(batch_size=64, size=8)
torch.manual_seed(0)
net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))  # defined in a cell: never pickled
initial = [p.clone() for p in net.parameters()]
model = kt.KerasModel(net, nn.CrossEntropyLoss(), {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)},
                      torch.optim.Adam(net.parameters(), lr=1e-2))""",
    """history = model.fit(dl_train, dl_val, epochs=3, accelerator="cpu", devices=2)""",
    """assert list(history.epoch) == [1, 2, 3], history
assert not any(torch.equal(a, b) for a, b in zip(initial, net.parameters()))
assert abs(model.evaluate(dl_val, quiet=True)["val_loss"] - history.val_loss.min()) < 1e-6
print("trained in the notebook's model")""",
]


@pytest.mark.slow
def test_fit_on_two_processes_from_a_jupyter_notebook():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in NOTEBOOK_CELLS])
    nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3").execute()  # a failing cell raises
    outputs = [out for cell in notebook.cells for out in cell.outputs]
    texts = "".join(out.get("text", "") for out in outputs)
    assert "training on 2 processes (cpu" in texts and "trained in the notebook's model" in texts
    assert "Launching training on" not in texts  # accelerate's line, which would say CUDA on a CPU
    assert any(out.output_type == "display_data" for out in outputs)  # the progress, updated in place


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_nodes_on_loopback_finish_with_identical_parameters(tmp_path):
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": REPO_ROOT, "OMP_NUM_THREADS": "1"}
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc_per_node=1",
                f"--node_rank={rank}",
                "--master_addr=127.0.0.1",
                f"--master_port={port}",
                TRAIN_SCRIPT,
                str(tmp_path),
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=120)[0] for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], "\n\n".join(outputs)

    first, second = (torch.load(tmp_path / f"rank{rank}.pt") for rank in (0, 1))
    assert first["num_processes"] == second["num_processes"] == 2
    assert not all(torch.equal(first["initial"][k], second["initial"][k]) for k in first["initial"])  # seeds differ
    assert all(torch.equal(first["final"][k], second["final"][k]) for k in first["final"])
    assert first["history"] == second["history"] and len(first["history"]["epoch"]) == 3
    # Only the main process prints and writes the checkpoint; the other node never needed the file.
    assert "Epoch 3/3" in outputs[0] and "Epoch" not in outputs[1]
    assert (tmp_path / "node0" / "best.safetensors").exists()
    assert not (tmp_path / "node1" / "best.safetensors").exists()


# -- DataParallel and model-parallel nets ---------------------------------------------


def test_dataparallel_net_trains_and_its_checkpoint_loads_into_the_bare_net(digits, tmp_path):
    dl_train, dl_val = digits
    torch.manual_seed(0)
    wrapped = nn.DataParallel(small_mlp())  # seeds 003 and 004; on a CPU-only machine it calls the module
    model = kt.KerasModel(
        wrapped, nn.CrossEntropyLoss(), {"acc": accuracy}, torch.optim.Adam(wrapped.parameters(), lr=1e-2)
    )
    ckpt = tmp_path / "best.safetensors"
    history = model.fit(dl_train, dl_val, epochs=2, ckpt_path=ckpt, accelerator="cpu", verbose=0)
    assert history["val_loss"].iloc[-1] < history["val_loss"].iloc[0]

    saved = load_weights(ckpt)
    assert set(saved) == set(small_mlp().state_dict())  # no "module." prefix
    bare = kt.KerasModel(small_mlp(), nn.CrossEntropyLoss())
    bare.load_ckpt(ckpt)
    assert all(torch.equal(bare.net.state_dict()[k], v) for k, v in wrapped.module.state_dict().items())
    model.save_ckpt(tmp_path / "again.safetensors")
    assert set(load_weights(tmp_path / "again.safetensors")) == set(saved)


class EncoderDecoder(nn.Module):
    """Seed 002: an encoder and a decoder the user put on devices of their choice."""

    def __init__(self, encoder_device="cpu", decoder_device="cpu"):
        super().__init__()
        self.encoder = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU()).to(encoder_device)
        self.decoder = nn.Linear(32, 10).to(decoder_device)

    def forward(self, x):
        hidden = self.encoder(x)
        return self.decoder(hidden.to(self.decoder.weight.device))


def test_model_parallel_nets_are_recognised_from_their_parameters():
    spread = EncoderDecoder("cpu", "meta")  # "meta" stands in for a second GPU: it has no data, only a device
    assert is_model_parallel(spread)
    assert parameter_devices(spread) == [torch.device("cpu"), torch.device("meta")]
    assert input_device(spread) == torch.device("cpu")
    assert not is_model_parallel(EncoderDecoder())
    assert not is_model_parallel(nn.DataParallel(small_mlp()))
    # Labels follow the output to its device; on the same device nothing is copied.
    labels = torch.tensor([1, 2])
    assert labels_to_outputs(labels, torch.zeros(2, 10, device="meta")).device == torch.device("meta")
    assert labels_to_outputs(labels, torch.zeros(2, 10)) is labels


@pytest.mark.slow
def test_a_model_parallel_net_is_not_copied_into_several_processes(digits):
    dl_train, _ = digits
    model = kt.KerasModel(EncoderDecoder("cpu", "meta"), nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match="model parallel, which trains in one process.*devices=1"):
        model.fit(dl_train, epochs=1, accelerator="cpu", devices=2, verbose=0)


def test_output_device_is_found_by_one_batch_and_leaves_the_data_order_alone(digits):
    dl_train, _ = digits
    model = kt.KerasModel(EncoderDecoder(), nn.CrossEntropyLoss())
    torch.manual_seed(3)
    expected = next(iter(dl_train))[1]
    torch.manual_seed(3)
    assert output_device(model, dl_train) == torch.device("cpu")
    assert torch.equal(next(iter(dl_train))[1], expected)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
@pytest.mark.gpu
def test_model_parallel_net_trains_where_the_user_put_it(digits):
    dl_train, dl_val = digits
    net = EncoderDecoder("cuda:0", "cuda:1")
    model = kt.KerasModel(
        net,
        nn.CrossEntropyLoss(),
        {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)},
        torch.optim.Adam(net.parameters(), lr=1e-2),
    )
    history = model.fit(dl_train, dl_val, epochs=2, verbose=0)
    assert parameter_devices(net) == [torch.device("cuda:0"), torch.device("cuda:1")]  # never moved
    assert history["val_loss"].iloc[-1] < history["val_loss"].iloc[0]
    assert model.evaluate(dl_val, quiet=True)["val_loss"] == pytest.approx(history["val_loss"].min())
