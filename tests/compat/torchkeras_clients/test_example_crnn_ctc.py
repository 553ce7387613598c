"""torchkeras's example ``examples/CRNN_CTC.ipynb`` (lyhue1991/torchkeras), with only the import
changed: a CRNN read 4-character captchas with a CTC loss, trained through the program's own
``StepRunner`` (``KerasModel.StepRunner = StepRunner``, ``loss_fn=None``, the loss and an accuracy
computed in the runner and both averaged as step losses), shown after every epoch by
``VisDisplay(display_fn, model)``, reloaded with ``model.load_ckpt`` and used to predict.

Replaced: the ``captcha`` package's ``ImageCaptcha`` and torchvision's ``to_tensor`` /
``to_pil_image`` (neither installed) by the stand-ins of ``stand_ins_captcha.py``, which draw
each character as a fixed pattern of its own plus noise, at the same size (the dataset's items
keep upstream's layout: float32 ``[3, 64, 192]`` in ``[0, 1]``, the target int64 ``[4]``, the
lengths int64 ``[1]``, 12 and 4); fewer and smaller batches and epochs; a higher learning rate
so that 3 short epochs learn something. Left out: the cell that draws a Chinese captcha with
torchkeras's font (it only draws). Upstream's notebook defines ``visdis`` in a cell after the
fit cell (it was run out of order); here that cell comes before the fit. The predict cell runs
on the CPU (upstream: ``.cuda()``)."""

from __future__ import annotations

import os
import random
import re
from collections import OrderedDict

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from stand_ins_captcha import ImageCaptcha, to_pil_image, to_tensor
from torch import nn
from torch.utils.data import DataLoader, Dataset

import kerastorch as torchkeras  # noqa: F401  # the one changed line: "import torchkeras" (used by the left-out cell)
from kerastorch import KerasModel

pytestmark = pytest.mark.slow

characters = "-" + "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"  # 注：’-‘ 为[blank] 特殊字符
width, height = 192, 64
n_classes = len(characters)

txt_length = 4  # 识别的验证码长度
seq_length = 12  # CRNN输出序列长度，一般要求 seq_length>=2*txt_length+1


class CaptchaDataset(Dataset):
    def __init__(self, characters, length, width, height, input_length, label_length):
        super().__init__()
        self.characters = characters
        self.length = length
        self.width = width
        self.height = height
        self.input_length = input_length
        self.label_length = label_length
        self.n_class = len(characters)
        self.generator = ImageCaptcha(width=width, height=height)

    def __len__(self):
        return self.length

    def __getitem__(self, index):
        random_str = "".join([random.choice(self.characters[1:]) for j in range(self.label_length)])
        image = to_tensor(self.generator.generate_image(random_str))
        target = torch.tensor([self.characters.find(x) for x in random_str], dtype=torch.long)
        input_length = torch.full(size=(1,), fill_value=self.input_length, dtype=torch.long)
        target_length = torch.full(size=(1,), fill_value=self.label_length, dtype=torch.long)
        return image, target, input_length, target_length


class CRNN(nn.Module):
    def __init__(self, n_classes, input_shape=(3, 64, 128)):
        super().__init__()
        self.input_shape = input_shape
        channels = [32, 64, 128, 256, 256]
        layers = [2, 2, 2, 2, 2]
        kernels = [3, 3, 3, 3, 3]
        pools = [2, 2, 2, 2, (2, 1)]
        modules = OrderedDict()

        def cba(name, in_channels, out_channels, kernel_size):
            modules[f"conv{name}"] = nn.Conv2d(
                in_channels, out_channels, kernel_size, padding=(1, 1) if kernel_size == 3 else 0
            )
            modules[f"bn{name}"] = nn.BatchNorm2d(out_channels)
            modules[f"relu{name}"] = nn.ReLU(inplace=True)

        last_channel = 3
        for block, (n_channel, n_layer, n_kernel, k_pool) in enumerate(zip(channels, layers, kernels, pools)):
            for layer in range(1, n_layer + 1):
                cba(f"{block + 1}{layer}", last_channel, n_channel, n_kernel)
                last_channel = n_channel
            modules[f"pool{block + 1}"] = nn.MaxPool2d(k_pool)
        modules["dropout"] = nn.Dropout(0.25, inplace=True)

        self.cnn = nn.Sequential(modules)
        self.lstm = nn.LSTM(input_size=self.infer_features(), hidden_size=128, num_layers=2, bidirectional=True)
        self.fc = nn.Linear(in_features=256, out_features=n_classes)

    def infer_features(self):
        x = torch.zeros((1, *self.input_shape))
        x = self.cnn(x)
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        return x.shape[1]

    def forward(self, x):
        x = self.cnn(x)
        x = x.reshape(x.shape[0], -1, x.shape[-1])
        x = x.permute(2, 0, 1)
        x, _ = self.lstm(x)
        x = self.fc(x)
        return x


# 解码函数和计算准确率函数


def decode_target(sequence):
    return "".join([characters[x] for x in sequence]).replace(" ", "")


def decode(sequence):
    a = "".join([characters[x] for x in sequence])
    s = "".join([x for j, x in enumerate(a[:-1]) if x != characters[0] and x != a[j + 1]])
    if len(s) == 0:
        return ""
    if a[-1] != characters[0] and s[-1] != a[-1]:
        s += a[-1]
    return s


def eval_acc(targets, preds):
    preds_argmax = preds.detach().permute(1, 0, 2).argmax(dim=-1)
    targets = targets.cpu().numpy()
    preds_argmax = preds_argmax.cpu().numpy()
    a = np.array([decode_target(gt) == decode(pred) for gt, pred in zip(targets, preds_argmax)])
    return a.mean()


# 我们覆盖KerasModel的StepRunner以实现自定义训练逻辑。
# 注意这里把acc指标的结果写在了step_loss中以便和loss一样在Epoch上求平均，这是一个非常灵活而且有用的写法。


class StepRunner:
    def __init__(self, net, loss_fn, accelerator, stage="train", metrics_dict=None, optimizer=None, lr_scheduler=None):
        self.net, self.loss_fn, self.metrics_dict, self.stage = net, loss_fn, metrics_dict, stage
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self.accelerator = accelerator
        if self.stage == "train":
            self.net.train()
        else:
            self.net.eval()

    def __call__(self, batch):
        images, targets, input_lengths, target_lengths = batch

        # loss
        preds = self.net(images)
        preds_log_softmax = F.log_softmax(preds, dim=-1)
        loss = F.ctc_loss(preds_log_softmax, targets, input_lengths, target_lengths)
        acc = eval_acc(targets, preds)

        # backward()
        if self.optimizer is not None and self.stage == "train":
            self.accelerator.backward(loss)
            self.optimizer.step()
            if self.lr_scheduler is not None:
                self.lr_scheduler.step()
            self.optimizer.zero_grad()

        all_loss = self.accelerator.gather(loss).sum()

        # losses
        step_losses = {self.stage + "_loss": all_loss.item(), self.stage + "_acc": acc}

        # metrics
        step_metrics = {}
        if self.stage == "train":
            if self.optimizer is not None:
                step_metrics["lr"] = self.optimizer.state_dict()["param_groups"][0]["lr"]
            else:
                step_metrics["lr"] = 0.0
        return step_losses, step_metrics


def test_crnn_ctc_with_the_programs_step_runner(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    random.seed(0)  # upstream: unseeded
    torch.manual_seed(0)
    from IPython.display import display  # upstream: the notebook's own display

    batch_size = 32  # upstream: 128 (the net is big for a 2-core CPU)
    ds_train = CaptchaDataset(characters, 4 * batch_size, width, height, seq_length, txt_length)  # upstream: 100 *

    ds_val = CaptchaDataset(characters, 2 * batch_size, width, height, seq_length, txt_length)  # upstream: 20 *

    dl_train = DataLoader(ds_train, batch_size=batch_size, num_workers=0)
    dl_val = DataLoader(ds_val, batch_size=batch_size, num_workers=0)

    ds_test = CaptchaDataset(characters, 1, width, height, seq_length, txt_length)

    image, target, input_length, label_length = ds_test[0]
    print("".join([characters[x] for x in target]), input_length, label_length)
    to_pil_image(image)

    net = CRNN(n_classes, input_shape=(3, height, width))
    inputs = torch.zeros((32, 3, height, width))
    outputs = net(inputs)
    print(outputs.shape)  # LSTM默认输出的形状是 Length在前
    # net.cuda();

    monkeypatch.setattr(KerasModel, "StepRunner", StepRunner)  # upstream: KerasModel.StepRunner = StepRunner

    model = KerasModel(
        net,
        loss_fn=None,
        optimizer=torch.optim.AdamW(net.parameters(), lr=1e-3),  # upstream: lr = 2e-6, over 30 epochs of 100 batches
    )

    # model.load_ckpt('ctc_crnn.pt')

    # upstream: this cell comes after the fit cell (the notebook was run out of order)
    def display_fn(model):
        model.eval()
        right = True
        while right:
            image, target, input_length, label_length = ds_test[0]
            output = model(image.unsqueeze(0))
            output_argmax = output.detach().permute(1, 0, 2).argmax(dim=-1)
            right = decode_target(target) == decode(output_argmax[0])
            print("gt:", decode_target(target), " ", "pred:", decode(output_argmax[0]))
        display(to_pil_image(image))

    from kerastorch.kerascallbacks import VisDisplay

    visdis = VisDisplay(display_fn, model)
    shown_before_fit = capsys.readouterr().out

    dfhistory = model.fit(
        train_data=dl_train,
        val_data=dl_val,
        ckpt_path="ctc_crnn.pt",
        epochs=3,  # upstream: 30
        patience=10,
        monitor="val_acc",
        mode="max",
        plot=True,
        wandb=False,
        callbacks=[visdis],
        cpu=True,
    )
    shown_in_fit = capsys.readouterr().out

    def predict(model, image):
        # model.cuda()  # upstream: on the GPU
        tensor = to_tensor(image)
        output = model(tensor.unsqueeze(0))  # upstream: tensor.unsqueeze(0).cuda()
        output_argmax = output.detach().permute(1, 0, 2).argmax(dim=-1)
        preds = decode(output_argmax[0])
        return preds

    model.load_ckpt("ctc_crnn.pt")

    generator = ImageCaptcha(width=width, height=height)
    image = generator.generate_image("ABBD")
    display(image)
    predicted = predict(model, image)

    torch.save(model.net.state_dict(), "best.pt")

    # What the program relies on: the history's columns as the runner names them (its acc averaged
    # like the loss, lr as a metric), one row per epoch; the CTC loss falling; VisDisplay's
    # display_fn run once when it is made and after every epoch (on the model, which it calls);
    # the checkpoint at ckpt_path loadable by load_ckpt and as a plain state dict; predict giving
    # a decoded string of the characters.
    assert list(dfhistory.columns) == ["epoch", "train_loss", "train_acc", "lr", "val_loss", "val_acc"]
    assert len(dfhistory) == 3 and dfhistory["epoch"].tolist() == [1, 2, 3]
    assert dfhistory["lr"].tolist() == pytest.approx([1e-3] * 3)
    assert ((dfhistory[["train_acc", "val_acc"]] >= 0) & (dfhistory[["train_acc", "val_acc"]] <= 1)).all().all()
    # The CTC loss fell (here about 7 -> 4 in 12 steps: the blanks and the 4 slots learnt; reading the
    # characters takes upstream's 3000 steps). At upstream's lr=2e-6 it stays at 8.5 in these steps.
    assert dfhistory["train_loss"].iloc[-1] < 0.8 * dfhistory["train_loss"].iloc[0]
    assert dfhistory["val_loss"].iloc[-1] < 0.8 * dfhistory["val_loss"].iloc[0]

    shown = re.compile(r"<PIL\.Image\.Image image mode=RGB size=192x64 at 0x[0-9A-Fa-f]+>")
    assert len(shown.findall(shown_before_fit)) == 1  # init_display: shown when VisDisplay is made
    assert len(shown.findall(shown_in_fit)) == 3  # and after each of the 3 epochs
    assert re.search(r"^gt: [0-9A-Z]{4}   pred: [0-9A-Z]*$", shown_in_fit, re.MULTILINE)

    assert os.path.isfile("ctc_crnn.pt") and os.path.isfile("best.pt")
    saved = torch.load("ctc_crnn.pt", weights_only=True)
    assert set(saved) == set(net.state_dict())
    assert all(torch.equal(saved[k], v) for k, v in model.net.state_dict().items())  # load_ckpt loaded it
    net_clone = CRNN(n_classes, input_shape=(3, height, width))
    net_clone.load_state_dict(torch.load("best.pt", weights_only=True))

    assert isinstance(predicted, str) and set(predicted) <= set(characters[1:])
    model.eval()
    net_clone.eval()
    with torch.no_grad():
        assert decode(net_clone(to_tensor(image).unsqueeze(0)).permute(1, 0, 2).argmax(dim=-1)[0]) == predicted
