"""An IterableDataset for validation over two processes: every sample once."""

from __future__ import annotations

import pytest
from small_runs import digits_for_processes, digits_model
from torch.utils.data import DataLoader, IterableDataset, Subset

# -- 19. an IterableDataset for validation over two processes: every sample once ---------------------


class Stream(IterableDataset):
    def __init__(self, dataset):
        self.dataset = dataset

    def __iter__(self):
        return iter(self.dataset)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_an_iterable_validation_set_over_two_processes_counts_every_sample_once(digits8, strategy):
    train, val = digits_for_processes(digits8)
    stream = DataLoader(Stream(Subset(digits8[1], range(101))), batch_size=16)
    model = digits_model()
    history = model.fit(train, stream, epochs=2, patience=None, verbose=0, accelerator="cpu", devices=2,
                        strategy=strategy)  # fmt: skip
    best = history.loc[history["val_loss"].idxmin()]
    scores = model.evaluate(val, quiet=True)  # one process, the map-style copy of the same 101 samples
    assert scores["val_loss"] == pytest.approx(best["val_loss"], rel=1e-6)
    assert scores["val_acc"] == pytest.approx(best["val_acc"], rel=1e-6)
    assert round(best["val_acc"] * 101) == pytest.approx(best["val_acc"] * 101, abs=1e-4)  # whole samples
