"""The net's train/eval modes in fit: modules the user put in eval mode (a frozen backbone's BatchNorm)
stay in eval mode while training, also when a callback puts them there; and after fit every module is
in the mode it was in when fit began."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt


def data(n=64):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 4, generator=g) * 3 + 1
    return DataLoader(TensorDataset(x, (x[:, 0] > 1).long()), batch_size=16)


def backbone_and_head():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2), nn.Dropout(0.2))


def fit(net, epochs=2, **keywords):
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    return model.fit(data(), data(), epochs=epochs, verbose=0, **keywords)


def test_a_batchnorm_put_in_eval_mode_before_fit_keeps_its_statistics_and_the_rest_trains():
    net = backbone_and_head()
    net[1].eval()
    before = {k: v.clone() for k, v in net[1].named_buffers()}
    weight_before = net[0].weight.detach().clone()
    fit(net)
    assert all(torch.equal(before[k], v) for k, v in net[1].named_buffers())  # running statistics untouched
    assert not torch.equal(net[0].weight, weight_before)  # the layers around it trained
    assert net.training and not net[1].training  # each module's mode as it was before fit


def test_a_net_wholly_in_eval_mode_trains_in_train_mode_and_is_back_in_eval_mode_after_fit():
    net = backbone_and_head()
    net.eval()  # left so by code that ran it for inference
    seen = []

    class Modes(kt.Callback):
        def on_train_batch_end(self, batch, logs=None):
            seen.append((self.model.net.training, self.model.net[1].training, self.model.net[4].training))

    before = net[1].running_mean.clone()
    fit(net, callbacks=[Modes()])
    assert set(seen) == {(True, True, True)}  # trained in train mode: dropout and BatchNorm's statistics on
    assert not torch.equal(net[1].running_mean, before)
    assert not any(module.training for module in net.modules())  # back in eval mode, every module


def test_a_module_a_callback_puts_in_eval_mode_stays_so_for_the_epoch():
    net = backbone_and_head()
    seen = []

    class FreezeFromEpoch2(kt.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                self.model.net[1].eval()

        def on_train_batch_end(self, batch, logs=None):
            seen.append(self.model.net[1].training)

    fit(net, epochs=3, callbacks=[FreezeFromEpoch2()])
    per_epoch = len(seen) // 3
    # Epoch 1 in train mode; from epoch 2 fit leaves it as the callback left it, but each epoch starts
    # from the modes training began with: the callback's change holds for the epoch it made it in.
    assert seen[:per_epoch] == [True] * per_epoch
    assert seen[per_epoch : 2 * per_epoch] == [False] * per_epoch
    assert seen[2 * per_epoch :] == [True] * per_epoch
    assert net.training and net[1].training  # after fit: the modes it began with
