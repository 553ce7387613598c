"""docs/custom-steps.md's GAN, smaller, for tests/callbacks/test_backup.py, started as a real process.

    python gan_training_script.py OUT_DIR [--kill-at EPOCH BATCH]

The model's optimizer updates the generator; the model keeps its own Adam for the discriminator
(``self.d_optimizer``) with a StepLR of its own (``self.d_scheduler``, stepped in ``train_step``).
``BackupAndRestore(OUT_DIR/backup, save_freq=3, delete_checkpoint=False)``. It writes the history
(``history.json``), the final weights (``final.safetensors``) and the discriminator's optimizer and
scheduler states (``own.pt``) to OUT_DIR. ``--kill-at`` sends SIGKILL to the process before that
batch of that epoch.
"""

import argparse
import json
import os
import signal

import torch
from safetensors.torch import save_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt

NOISE = 4
bce = nn.BCEWithLogitsLoss()


class GAN(kt.KerasModel):
    def __init__(self, generator, discriminator):
        net = nn.ModuleDict({"generator": generator, "discriminator": discriminator})
        super().__init__(net, optimizer=torch.optim.Adam(generator.parameters(), lr=2e-3, betas=(0.5, 0.999)))
        self.d_optimizer = torch.optim.Adam(discriminator.parameters(), lr=2e-3, betas=(0.5, 0.999))
        self.d_scheduler = torch.optim.lr_scheduler.StepLR(self.d_optimizer, step_size=4, gamma=0.7)

    def train_step(self, batch):
        (real,) = batch
        generator, discriminator = self.net["generator"], self.net["discriminator"]
        fake = generator(torch.randn(len(real), NOISE, device=real.device))
        ones, zeros = torch.ones(len(real), 1, device=real.device), torch.zeros(len(real), 1, device=real.device)
        d_loss = bce(discriminator(real), ones) + bce(discriminator(fake.detach()), zeros)
        self.backward(d_loss)
        self.optimizer_step(self.d_optimizer)
        self.d_scheduler.step()
        g_loss = bce(discriminator(fake), ones)
        self.backward(g_loss)
        self.optimizer_step(self.optimizer)
        return {"d_loss": d_loss.detach(), "g_loss": g_loss.detach()}


class KillAt(kt.Callback):
    def __init__(self, epoch, batch):
        self.at, self.epoch = (epoch, batch), None

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_begin(self, batch, logs=None):
        if (self.epoch, batch) == self.at:
            os.kill(os.getpid(), signal.SIGKILL)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--kill-at", nargs=2, type=int)
    args = parser.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)

    torch.set_num_threads(1)
    kt.seed_everything(0)
    real = 4 + 1.25 * torch.randn(256, 1)
    generator = nn.Sequential(nn.Linear(NOISE, 16), nn.ReLU(), nn.Linear(16, 1))
    discriminator = nn.Sequential(nn.Linear(1, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
    model = GAN(generator, discriminator)
    backup = kt.callbacks.BackupAndRestore(os.path.join(args.out_dir, "backup"), save_freq=3, delete_checkpoint=False)
    callbacks = [backup] + ([KillAt(*args.kill_at)] if args.kill_at else [])
    loader = DataLoader(TensorDataset(real), batch_size=32, shuffle=True)
    history = model.fit(loader, epochs=3, monitor=None, verbose=0, callbacks=callbacks, accelerator="cpu")

    with open(os.path.join(args.out_dir, "history.json"), "w") as f:
        json.dump(history.to_dict(orient="list"), f)
    save_file(
        {k: v.contiguous() for k, v in model.net.state_dict().items()}, os.path.join(args.out_dir, "final.safetensors")
    )
    torch.save(
        {"d_optimizer": model.d_optimizer.state_dict(), "d_scheduler": model.d_scheduler.state_dict()},
        os.path.join(args.out_dir, "own.pt"),
    )


if __name__ == "__main__":
    main()
