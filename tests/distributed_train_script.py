"""One training script for every rank of a torchrun / accelerate launch job (used by test_distributed.py).

Each rank seeds its net differently on purpose: DDP must start them all from the main
process's weights. Each rank writes its own results file (the test compares them) and
gets its own checkpoint folder, as on machines that share no filesystem.

    torchrun --nnodes=2 --nproc_per_node=1 --node_rank=0 --master_addr=127.0.0.1 --master_port=29500 \
        tests/distributed_train_script.py OUT_DIR
"""

import json
import os
import sys

import torch
import torchmetrics
from torch import nn

import kerastorch as kt
from kerastorch.examples import digits_loaders


def main(out_dir: str) -> None:
    rank = int(os.environ["RANK"])
    torch.manual_seed(100 + rank)
    dl_train, dl_val, _ = digits_loaders(batch_size=64, size=8)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))
    initial = {k: v.clone() for k, v in net.state_dict().items()}
    model = kt.KerasModel(
        net,
        nn.CrossEntropyLoss(),
        {"acc": torchmetrics.Accuracy(task="multiclass", num_classes=10)},
        torch.optim.Adam(net.parameters(), lr=1e-2),
    )
    ckpt_path = os.path.join(out_dir, f"node{rank}", "best.safetensors")
    history = model.fit(dl_train, dl_val, epochs=3, accelerator="cpu", ckpt_path=ckpt_path, verbose=2)
    torch.save(
        {
            "final": model.net.state_dict(),
            "initial": initial,
            "history": history.to_dict("list"),
            "num_processes": model.runtime.num_processes if model.runtime else None,
        },
        os.path.join(out_dir, f"rank{rank}.pt"),
    )
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "epochs": len(history)}, f)
    if torch.distributed.is_initialized():  # close gloo before exit, not in the interpreter's teardown
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
