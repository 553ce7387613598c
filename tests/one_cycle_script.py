"""fit_one_cycle in every rank of a torchrun job (used by test_structure.py): the learning rate of
each optimizer step is recorded, and rank 0 writes them with the number of processes.

    torchrun --nproc_per_node=2 tests/one_cycle_script.py OUT_FILE
"""

import json
import os
import sys

import torch
from torch import nn

import kerastorch as kt
from kerastorch.examples import digits_loaders


class StepRates(kt.Callback):
    """The learning rate each optimizer step uses."""

    def __init__(self):
        self.rates = []

    def on_before_optimizer_step(self, optimizer):
        self.rates.append(optimizer.param_groups[0]["lr"])


def main(out_file: str) -> None:
    torch.manual_seed(0)
    dl_train, _, _ = digits_loaders(batch_size=64, size=8)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    rates = StepRates()
    model.fit_one_cycle(dl_train, epochs=2, max_lr=0.5, accelerator="cpu", callbacks=[rates], verbose=0)
    if int(os.environ["RANK"]) == 0:
        with open(out_file, "w") as f:
            json.dump({"rates": rates.rates, "batches": len(dl_train), "world_size": int(os.environ["WORLD_SIZE"])}, f)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
