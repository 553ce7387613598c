"""fit(ckpt_path=..., resume=True): a killed run, started again, ends exactly as if never stopped."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt
from kerastorch.files.state import load_state_file, training_state_path

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO_ROOT, "tests", "resume_training_script.py")


# -- a real process, killed and started again ---------------------------------------------------


def start_script(out_dir, ckpt_path, *extra) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    os.makedirs(out_dir, exist_ok=True)
    return subprocess.Popen(
        [sys.executable, SCRIPT, str(out_dir), str(ckpt_path), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(process: subprocess.Popen) -> tuple[int, str]:
    output, _ = process.communicate(timeout=240)
    return process.returncode, output


def read_run(out_dir) -> tuple[pd.DataFrame, dict]:
    with open(os.path.join(out_dir, "history.json")) as f:
        history = pd.DataFrame(json.load(f))
    return history, load_file(os.path.join(out_dir, "final.safetensors"))


@pytest.mark.slow
def test_a_run_killed_mid_epoch_and_mid_write_resumes_to_the_uninterrupted_result(tmp_path):
    # The run that is never interrupted goes on beside the one that is killed twice.
    reference = start_script(tmp_path / "reference", tmp_path / "reference" / "best.safetensors")
    ckpt = tmp_path / "killed" / "best.safetensors"
    state_path = training_state_path(ckpt)

    # 1. SIGKILL before batch 5 of epoch 3: the state on disk is epoch 2's.
    code, output = finish(start_script(tmp_path / "killed", ckpt, "--kill-at", "3", "5"))
    assert code == -signal.SIGKILL, output
    assert load_state_file(state_path)["epoch"] == 2
    assert not os.path.exists(tmp_path / "killed" / "history.json")

    # 2. Resumed, then SIGKILL halfway through writing the state of epoch 4 (its 2nd write):
    #    the half-written file is a temporary one; the state file is epoch 3's, whole.
    code, output = finish(start_script(tmp_path / "killed", ckpt, "--kill-in-write", "2"))
    assert code == -signal.SIGKILL, output
    leftovers = glob.glob(str(tmp_path / "killed" / ".best.safetensors.state.*.tmp"))
    assert len(leftovers) == 1
    assert load_state_file(state_path)["epoch"] == 3

    # 3. Resumed again, it runs to the end.
    code, output = finish(start_script(tmp_path / "killed", ckpt))
    assert code == 0, output
    assert not glob.glob(str(tmp_path / "killed" / ".*.tmp"))  # the stale temporary file is gone

    code, output = finish(reference)
    assert code == 0, output
    history, weights = read_run(tmp_path / "killed")
    reference_history, reference_weights = read_run(tmp_path / "reference")
    assert history["epoch"].tolist() == [1, 2, 3, 4, 5, 6]
    pd.testing.assert_frame_equal(history, reference_history, check_exact=True)
    assert weights.keys() == reference_weights.keys()
    for name in weights:
        assert torch.equal(weights[name], reference_weights[name]), name
    # the best-weights file is the same too
    best, reference_best = load_file(ckpt), load_file(tmp_path / "reference" / "best.safetensors")
    assert all(torch.equal(best[k], reference_best[k]) for k in best)


# -- in-process checks on a tiny run ----------------------------------------------------------------


def tiny_data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(96, 6, generator=g)
    y = (x[:, 0] - x[:, 1] > 0).long()
    # The loader's own generator decides the shuffle: its state must be restored too.
    dl_train = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True, generator=torch.Generator().manual_seed(1))
    dl_val = DataLoader(TensorDataset(x[:48] + 0.1, y[:48]), batch_size=24)
    return dl_train, dl_val


def tiny_model(hidden: int = 16, optimizer: str = "sgd") -> kt.KerasModel:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(6, hidden), nn.ReLU(), nn.Dropout(0.2), nn.Linear(hidden, 2))
    opt = (
        torch.optim.SGD(net.parameters(), lr=0.2, momentum=0.9)
        if optimizer == "sgd"
        else torch.optim.Adam(net.parameters(), lr=1e-2)
    )
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    return kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=opt, lr_scheduler=scheduler)


def weights_of(model) -> dict:
    return {k: v.clone() for k, v in model.net.state_dict().items()}


class CountEpochs(kt.Callback):
    def __init__(self):
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)


def test_more_epochs_after_a_finished_run_continue_exactly(tmp_path):
    dl_train, dl_val = tiny_data()
    straight = tiny_model()
    straight_history = straight.fit(dl_train, dl_val, epochs=5, patience=None, verbose=0)

    dl_train, dl_val = tiny_data()
    first = tiny_model()
    first.fit(
        dl_train, dl_val, epochs=3, patience=None, verbose=0, ckpt_path=tmp_path / "best.safetensors", resume=True
    )
    counter = CountEpochs()
    dl_train, dl_val = tiny_data()
    second = tiny_model()
    history = second.fit(
        dl_train,
        dl_val,
        epochs=5,
        patience=None,
        verbose=0,
        callbacks=[counter],
        ckpt_path=tmp_path / "best.safetensors",
        resume=True,
    )

    assert counter.epochs == [4, 5]
    pd.testing.assert_frame_equal(history, straight_history, check_exact=True)
    assert all(torch.equal(a, b) for a, b in zip(weights_of(second).values(), weights_of(straight).values()))


def test_a_resumed_run_writes_the_best_weights_again_when_their_file_is_gone(tmp_path, capsys):
    ckpt = tmp_path / "best.safetensors"
    dl_train, dl_val = tiny_data()
    tiny_model().fit(dl_train, dl_val, epochs=2, patience=None, verbose=0, ckpt_path=ckpt, resume=True)
    ckpt.unlink()  # deleted by hand; the training state beside it stays
    dl_train, dl_val = tiny_data()
    model = tiny_model()
    model.fit(dl_train, dl_val, epochs=3, patience=None, verbose=1, ckpt_path=ckpt, resume=True)
    assert "was missing: the weights of epoch" in capsys.readouterr().out
    written = load_file(ckpt)  # the best weights, which fit put back in the net
    assert all(torch.equal(written[name], value) for name, value in weights_of(model).items())


def test_running_a_finished_run_again_returns_its_history_and_best_weights_without_training(tmp_path):
    ckpt = tmp_path / "best.safetensors"
    dl_train, dl_val = tiny_data()
    first = tiny_model()
    first_history = first.fit(dl_train, dl_val, epochs=3, patience=None, verbose=0, ckpt_path=ckpt, resume=True)

    counter = CountEpochs()
    again = tiny_model()
    history = again.fit(
        dl_train, dl_val, epochs=3, patience=None, verbose=0, ckpt_path=ckpt, resume=True, callbacks=[counter]
    )
    assert counter.epochs == []
    pd.testing.assert_frame_equal(history, first_history, check_exact=True)
    assert all(torch.equal(a, b) for a, b in zip(weights_of(again).values(), weights_of(first).values()))


def test_an_early_stopped_run_stays_stopped_when_run_again(tmp_path):
    ckpt = tmp_path / "best.safetensors"
    dl_train, dl_val = tiny_data()
    # The training loss falls, so with mode="max" epoch 1 stays the best and patience 2 stops at epoch 3.
    first = tiny_model().fit(
        dl_train,
        dl_val,
        epochs=10,
        patience=2,
        monitor="train_loss",
        mode="max",
        verbose=0,
        ckpt_path=ckpt,
        resume=True,
    )
    assert first["epoch"].tolist() == [1, 2, 3]
    counter = CountEpochs()
    again = tiny_model().fit(
        dl_train,
        dl_val,
        epochs=10,
        patience=2,
        monitor="train_loss",
        mode="max",
        verbose=0,
        ckpt_path=ckpt,
        resume=True,
        callbacks=[counter],
    )
    assert counter.epochs == []
    pd.testing.assert_frame_equal(again, first, check_exact=True)


def test_the_state_file_holds_the_whole_run_and_loads_without_pickle(tmp_path):
    ckpt = tmp_path / "best.safetensors"
    dl_train, dl_val = tiny_data()
    model = tiny_model()
    model.fit(dl_train, dl_val, epochs=2, patience=1, verbose=0, ckpt_path=ckpt, resume=True)

    state = torch.load(training_state_path(ckpt), weights_only=True)
    assert state["epoch"] == 2 and [row["epoch"] for row in state["history"]] == [1, 2]
    assert set(state["callbacks"]) >= {"RestoreBestWeights", "EarlyStopping"}
    assert set(state["callbacks"]["EarlyStopping"]) >= {"best", "best_epoch", "wait"}
    assert state["lr_scheduler"]["last_epoch"] == 2
    assert all("momentum_buffer" in s for s in state["optimizer"]["state"].values())
    assert state["batches"] == 0 and len(state["processes"]) == 1  # after an epoch; one process's part
    rng = state["processes"][0]["rng"]
    assert set(rng) >= {"python", "numpy", "torch", "cuda", "data_order", "data_generators"}
    assert len(rng["data_order"][0]) == 1  # the train loader's generator
    assert sorted(os.listdir(tmp_path)) == ["best.safetensors", "best.safetensors.state"]


def test_resume_with_no_state_starts_fresh_and_says_nothing_about_resuming(tmp_path, capsys):
    dl_train, dl_val = tiny_data()
    history = tiny_model().fit(dl_train, dl_val, epochs=2, verbose=2, ckpt_path=tmp_path / "w.safetensors", resume=True)
    assert history["epoch"].tolist() == [1, 2]
    assert "Resuming" not in capsys.readouterr().out
    assert os.path.isfile(tmp_path / "w.safetensors.state")


def test_resuming_says_where_it_continues_from(tmp_path, capsys):
    dl_train, dl_val = tiny_data()
    tiny_model().fit(dl_train, dl_val, epochs=1, verbose=0, ckpt_path=tmp_path / "w.safetensors", resume=True)
    tiny_model().fit(dl_train, dl_val, epochs=2, verbose=2, ckpt_path=tmp_path / "w.safetensors", resume=True)
    assert "Resuming after epoch 1 from the training state in" in capsys.readouterr().out


def saved_run(tmp_path):
    ckpt = tmp_path / "best.safetensors"
    dl_train, dl_val = tiny_data()
    tiny_model().fit(dl_train, dl_val, epochs=1, verbose=0, ckpt_path=ckpt, resume=True)
    return ckpt, dl_train, dl_val


def test_resuming_with_a_different_net_shape_is_a_clear_error(tmp_path):
    ckpt, dl_train, dl_val = saved_run(tmp_path)
    other = tiny_model(hidden=24)
    before = weights_of(other)
    with pytest.raises(
        ValueError,
        match=r"saved from a different net: 0\.weight has shape \(16, 6\) there and "
        r"\(24, 6\) here.*delete .*best\.safetensors\.state.*resume=False",
    ):
        other.fit(dl_train, dl_val, epochs=2, verbose=0, ckpt_path=ckpt, resume=True)
    assert all(torch.equal(before[k], v) for k, v in other.net.state_dict().items())


def test_resuming_with_a_different_optimizer_is_a_clear_error(tmp_path):
    ckpt, dl_train, dl_val = saved_run(tmp_path)
    adam = tiny_model(optimizer="adam")
    with pytest.raises(ValueError, match="saved with a SGD optimizer, but this model has a Adam"):
        adam.fit(dl_train, dl_val, epochs=2, verbose=0, ckpt_path=ckpt, resume=True)

    # the same net, but an optimizer over its last layer only
    head_only = tiny_model()
    head_only.optimizer = torch.optim.SGD(head_only.net[3].parameters(), lr=0.2, momentum=0.9)
    head_only.lr_scheduler = torch.optim.lr_scheduler.StepLR(head_only.optimizer, step_size=1, gamma=0.7)
    before = weights_of(head_only)
    with pytest.raises(
        ValueError,
        match=r"optimizer over other parameters: 4 tensors \(146 numbers\) there, "
        r"2 tensors \(34 numbers\) here",
    ):
        head_only.fit(dl_train, dl_val, epochs=2, verbose=0, ckpt_path=ckpt, resume=True)
    assert all(torch.equal(before[k], v) for k, v in head_only.net.state_dict().items())


def test_resuming_without_the_scheduler_it_was_saved_with_is_a_clear_error(tmp_path):
    ckpt, dl_train, dl_val = saved_run(tmp_path)
    model = tiny_model()
    model.lr_scheduler = None
    with pytest.raises(ValueError, match="saved with lr_scheduler=StepLR, but this model has lr_scheduler=None"):
        model.fit(dl_train, dl_val, epochs=2, verbose=0, ckpt_path=ckpt, resume=True)


def test_resuming_while_monitoring_another_value_is_a_clear_error(tmp_path):
    ckpt, dl_train, dl_val = saved_run(tmp_path)  # saved while watching val_loss, mode min
    model = tiny_model()
    with pytest.raises(
        ValueError,
        match=r"saved with RestoreBestWeights watching monitor='val_loss', mode='min'; this "
        r"run asks for monitor='train_loss', mode='max'",
    ):
        model.fit(dl_train, dl_val, epochs=2, verbose=0, ckpt_path=ckpt, resume=True, monitor="train_loss", mode="max")


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty", "weights file"])
def test_a_damaged_state_file_is_refused_with_the_path_and_the_way_out(tmp_path, damage):
    ckpt, dl_train, dl_val = saved_run(tmp_path)
    state_path = training_state_path(ckpt)
    data = open(state_path, "rb").read()
    if damage == "truncated":
        open(state_path, "wb").write(data[: len(data) // 2])
    elif damage == "garbage":
        open(state_path, "wb").write(b"not a checkpoint at all" * 10)
    elif damage == "empty":
        open(state_path, "wb").close()
    else:  # someone saved plain weights under the state's name
        torch.save(tiny_model().net.state_dict(), state_path)
    model = tiny_model()
    before = weights_of(model)
    with pytest.raises(
        ValueError, match=r"best\.safetensors\.state.*(delete it to start fresh|Delete it to start fresh)"
    ):
        model.fit(dl_train, dl_val, epochs=2, verbose=0, ckpt_path=ckpt, resume=True)
    assert all(torch.equal(before[k], v) for k, v in model.net.state_dict().items())


def test_a_callback_state_that_cannot_be_stored_safely_is_refused_before_training(tmp_path):
    class KeepsAnObject(kt.Callback):
        def state_dict(self):
            return {"seen": [1, 2], "tool": object()}

    dl_train, dl_val = tiny_data()
    model = tiny_model()
    before = weights_of(model)
    with pytest.raises(TypeError, match=r"the KeepsAnObject callback's state_dict\(\)\['tool'\] is a object"):
        model.fit(
            dl_train,
            dl_val,
            epochs=2,
            verbose=0,
            ckpt_path=tmp_path / "w.safetensors",
            resume=True,
            callbacks=[KeepsAnObject()],
        )
    assert all(torch.equal(before[k], v) for k, v in model.net.state_dict().items())
    assert not os.path.exists(tmp_path / "w.safetensors.state")


def test_a_samplers_epoch_counter_is_part_of_the_saved_data_order():
    from torch.utils.data import DistributedSampler

    from kerastorch.helpers.rng import capture_rng_state, restore_rng_state

    dataset = TensorDataset(torch.arange(40.0))

    def loader():  # a DistributedSampler shuffles by its epoch, which a loop sets with set_epoch
        return DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset, num_replicas=2, rank=0))

    running = loader()
    running.sampler.set_epoch(3)
    state = capture_rng_state([running])
    fresh = loader()
    restore_rng_state(state, [fresh])
    assert fresh.sampler.epoch == 3
    assert [b[0].tolist() for b in fresh] == [b[0].tolist() for b in running]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.gpu
def test_on_a_gpu_the_grad_scaler_and_cuda_generators_are_saved_and_restored(tmp_path):
    ckpt = tmp_path / "best.safetensors"
    dl_train, dl_val = tiny_data()
    first = tiny_model()
    first_history = first.fit(
        dl_train, dl_val, epochs=2, verbose=0, accelerator="cuda", precision="16-mixed", ckpt_path=ckpt, resume=True
    )
    state = load_state_file(training_state_path(ckpt))
    assert len(state["processes"][0]["rng"]["cuda"]) == torch.cuda.device_count()
    assert state["grad_scaler"] is not None and "scale" in state["grad_scaler"]

    class ReadScaler(kt.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.scale = self.model.runtime.scaler.get_scale()
            self.cuda_rng = torch.cuda.get_rng_state()

    reader = ReadScaler()
    dl_train, dl_val = tiny_data()
    history = tiny_model().fit(
        dl_train,
        dl_val,
        epochs=3,
        verbose=0,
        accelerator="cuda",
        precision="16-mixed",
        ckpt_path=ckpt,
        resume=True,
        callbacks=[reader],
    )
    assert history["epoch"].tolist() == [1, 2, 3]
    pd.testing.assert_frame_equal(history.iloc[:2], first_history, check_exact=True)
    assert reader.scale == float(state["grad_scaler"]["scale"])
    assert torch.equal(reader.cuda_rng, state["processes"][0]["rng"]["cuda"][torch.cuda.current_device()])


def test_a_state_written_by_the_previous_version_still_resumes_exactly(tmp_path):
    # Version 1 (epochs only) kept one random state for every process, at the top of the file.
    ckpt = tmp_path / "best.safetensors"
    dl_train, dl_val = tiny_data()
    straight = tiny_model().fit(dl_train, dl_val, epochs=3, patience=None, verbose=0)
    dl_train, dl_val = tiny_data()
    tiny_model().fit(dl_train, dl_val, epochs=2, patience=None, verbose=0, ckpt_path=ckpt, resume=True)
    state = load_state_file(training_state_path(ckpt))
    rng = state.pop("processes")[0]["rng"]
    del state["batches"], state["epoch_lr"], rng["data_generators"]
    torch.save({**state, "version": 1, "rng": rng}, training_state_path(ckpt))
    dl_train, dl_val = tiny_data()
    resumed = tiny_model().fit(dl_train, dl_val, epochs=3, patience=None, verbose=0, ckpt_path=ckpt, resume=True)
    pd.testing.assert_frame_equal(resumed, straight, check_exact=True)
