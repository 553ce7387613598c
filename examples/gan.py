"""A GAN with fit: a generator learns to draw samples of N(4, 1.25) from noise.

The two nets live in one ``nn.ModuleDict``, so fit moves, saves and restores both. The
model's optimizer updates the generator, a second one the discriminator, and
``train_step`` does the two updates. It returns a dict of named values: they become the
history's ``train_d_loss`` and ``train_g_loss``. A GAN's losses do not say which epoch
is best, so nothing is monitored: fit trains every epoch and keeps the last weights.
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import kerastorch as kt

NOISE = 8
bce = nn.BCEWithLogitsLoss()


class GAN(kt.KerasModel):
    def __init__(self, generator: nn.Module, discriminator: nn.Module):
        net = nn.ModuleDict({"generator": generator, "discriminator": discriminator})
        adam = dict(lr=2e-3, betas=(0.5, 0.999))
        optimizer = torch.optim.Adam(generator.parameters(), **adam)
        super().__init__(net, optimizer=optimizer)
        self.d_optimizer = torch.optim.Adam(discriminator.parameters(), **adam)

    def train_step(self, batch):
        (real,) = batch  # batches without labels: a GAN needs none
        generator, discriminator = self.net["generator"], self.net["discriminator"]
        fake = generator(torch.randn(len(real), NOISE, device=real.device))
        ones = torch.ones(len(real), 1, device=real.device)
        zeros = torch.zeros(len(real), 1, device=real.device)

        # The discriminator: real samples are 1, fakes 0. The fakes are detached:
        # this loss must not reach the generator.
        d_real = bce(discriminator(real), ones)
        d_loss = d_real + bce(discriminator(fake.detach()), zeros)
        self.backward(d_loss)
        self.optimizer_step(self.d_optimizer)  # steps, then zeroes its gradients

        # The generator: fool the discriminator. This backward also reaches the
        # discriminator's parameters; fit drops that before its next update.
        g_loss = bce(discriminator(fake), ones)
        self.backward(g_loss)
        self.optimizer_step(self.optimizer)
        return {"d_loss": d_loss.detach(), "g_loss": g_loss.detach()}


kt.seed_everything(0)
real = 4 + 1.25 * torch.randn(2048, 1)
generator = nn.Sequential(nn.Linear(NOISE, 32), nn.ReLU(), nn.Linear(32, 1))
discriminator = nn.Sequential(nn.Linear(1, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
model = GAN(generator, discriminator)
loader = DataLoader(TensorDataset(real), batch_size=128, shuffle=True)
history = model.fit(loader, epochs=25, monitor=None, verbose=2)

with torch.no_grad():
    samples = model.net["generator"](torch.randn(4096, NOISE))
print(f"generated: mean {samples.mean():.2f}, std {samples.std():.2f}")
print("(the data: mean 4.00, std 1.25)")
