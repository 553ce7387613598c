"""The loaders kerastorch builds, and what wraps a loader for one run: class weights,
Keras's ``steps_per_epoch`` and ``validation_steps``; every training label read for class weights."""

from __future__ import annotations

import itertools
from typing import Any, Iterator, Optional

import torch
from torch.utils.data import (
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    Subset,
    TensorDataset,
)

from ..settings import DEFAULT_BATCH_SIZE, DataSettings
from .arrays import ArrayDataset, LabelGroup, batch_as_read
from .batches import LABEL_KEYS, unpack
from .peek import num_batches, rng_untouched
from .resumable import resumable
from .sample_weights import ClassWeighted, check_weighted_loss, class_weight_table


def loader_for(dataset: Dataset, batch_size: Optional[int], shuffle: bool, pin_memory: bool) -> DataLoader:
    """The DataLoader kerastorch builds: ``batch_size`` (default 32), shuffled for training.

    Over arrays (an :class:`~kerastorch.data.arrays.ArrayDataset`, or a ``Subset`` of one for
    ``validation_split``) each batch is read with one index per array: torch's fetcher hands the
    batch's indices to the dataset's ``__getitems__``, and the loader keeps the batch it makes
    (:func:`~kerastorch.data.arrays.batch_as_read`). The sampler, and so the data order and the random
    numbers drawn, are those of the same DataLoader without it.

    No worker processes: for data already in memory they only add copying; when loading a
    sample does real work (files, augmentation), pass your own
    ``DataLoader(dataset, num_workers=...)`` instead.
    """
    iterable = isinstance(dataset, IterableDataset)
    return DataLoader(
        dataset,
        batch_size=batch_size or DEFAULT_BATCH_SIZE,
        shuffle=shuffle and not iterable,
        pin_memory=pin_memory,
        collate_fn=batch_as_read if _holds_arrays(dataset) else None,  # None: torch's default_collate
    )


def _holds_arrays(dataset: Dataset) -> bool:
    """An :class:`~kerastorch.data.arrays.ArrayDataset`, or a ``Subset`` of one (whose ``__getitems__``
    hands the indices on to it)."""
    while type(dataset) is Subset:
        dataset = dataset.dataset
    return type(dataset) is ArrayDataset


class EpochSteps:
    """``steps_per_epoch`` batches per epoch from one iterator that the next epoch continues,
    as Keras does; a finite loader that runs out starts a new pass.

    Where that iterator is inside its pass is part of a training state (the loader it reads is a
    :class:`~kerastorch.data.resumable.ResumableLoader` then): a resumed run goes on with the same
    pass, and :meth:`continue_epoch_at` makes its first epoch hand out only the batches left."""

    def __init__(self, loader: Any, steps: int):
        self.loader = loader  # named so that rng.py finds the data order inside
        self.steps = steps
        self._iterator: Optional[Iterator] = None
        self._first_step = 0

    def continue_epoch_at(self, step: int) -> None:
        """The next epoch is one a saved run left after ``step`` batches: hand out the rest."""
        self._first_step = step

    def __iter__(self) -> Iterator:
        first, self._first_step = self._first_step, 0
        if first and self._iterator is None:  # resumed: the saved run's pass is rebuilt now, at the epoch's start
            self._iterator = iter(self.loader)
        for _ in range(first, self.steps):
            if self._iterator is None:
                self._iterator = iter(self.loader)
            try:
                yield next(self._iterator)
            except StopIteration:
                self._iterator = iter(self.loader)
                try:
                    yield next(self._iterator)
                except StopIteration:
                    return  # an empty loader: the loop says so

    def __len__(self) -> int:
        return self.steps


class FirstBatches:
    """The first ``steps`` batches of each pass over ``loader`` (fewer if it has fewer): Keras's
    ``validation_steps`` and ``evaluate`` / ``predict``'s ``steps``, each pass starting afresh."""

    def __init__(self, loader: Any, steps: int):
        self.loader = loader  # named so that rng.py finds the data order inside
        self.steps = steps

    def __iter__(self) -> Iterator:
        return itertools.islice(iter(self.loader), self.steps)

    def __len__(self) -> int:
        total = num_batches(self.loader)
        return self.steps if total is None else min(self.steps, total)


def what_batches_hold(loader: Any) -> str:
    """What each batch of ``loader`` is, for ``predict`` to join the outputs: ``"batches"`` for a loader
    that batches (the usual); for a torch DataLoader with automatic batching off (``batch_size=None``),
    which hands over its dataset's items as they are, ``"samples"`` when the dataset's items are rows of
    arrays (a tensor, a ``TensorDataset``, the arrays kerastorch batches, a ``Subset`` of one), and
    ``"items"`` for any other dataset, whose items may be samples or batches made by the dataset itself
    (an ``IterableDataset`` that yields batches: torch's advice for data that batches itself).
    Looks through the wrappers kerastorch puts around a loader (``steps``)."""
    while isinstance(loader, FirstBatches):
        loader = loader.loader
    # DataLoader's own test for automatic batching (its private _auto_collation) is this one.
    if not isinstance(loader, DataLoader) or loader.batch_sampler is not None:
        return "batches"
    if not isinstance(loader.sampler, (SequentialSampler, RandomSampler)):
        # A sampler of the user's own may hand over several indices at once (a BatchSampler given as
        # sampler=, a fast way to batch a TensorDataset): its items may be batches.
        return "items"
    dataset = loader.dataset
    while isinstance(dataset, Subset):
        dataset = dataset.dataset
    return "samples" if isinstance(dataset, (torch.Tensor, TensorDataset, ArrayDataset)) else "items"


def training_labels(loader: Any) -> torch.Tensor:
    """Every training label, for class weights: read from the arrays when kerastorch built the
    loader, else by one pass over the loader (its data order left as it was)."""
    dataset = getattr(loader, "dataset", None)
    indices: Any = slice(None)
    if isinstance(dataset, Subset):
        dataset, indices = dataset.dataset, list(dataset.indices)  # type: ignore[attr-defined]
    if isinstance(dataset, ArrayDataset):
        arrays = dataset.arrays
        labels = next(v for k, v in arrays.items() if k in LABEL_KEYS) if isinstance(arrays, dict) else arrays[-1]
        if isinstance(labels, LabelGroup):
            raise ValueError(
                "class_weight weighs the classes of one array of labels, and these labels are one array per "
                "output of the net (fit(X, [y1, y2])), as in Keras, which takes class_weight only for a net "
                "with one output. Weight the classes in the loss instead: nn.CrossEntropyLoss(weight=...)."
            )
        return labels[indices]
    found = []
    with rng_untouched(loader):
        for batch in loader:
            labels = unpack(batch).labels
            found.append(torch.as_tensor(labels).cpu())  # one-hot rows kept whole: class weights read their argmax
    return torch.cat(found) if found else torch.zeros(0, dtype=torch.long)


def per_process_training_data(
    loader: Any, settings: DataSettings, class_weights: Optional[torch.Tensor], followed: bool = False
) -> Any:
    """What wraps this process's share of the training loader: followed batch by batch when a
    training state is kept (see :mod:`~kerastorch.data.resumable`), class weights, then steps per epoch."""
    if followed:
        loader = resumable(loader)
    if class_weights is not None:
        loader = ClassWeighted(loader, class_weights)
    if settings.steps_per_epoch is not None:
        loader = EpochSteps(loader, settings.steps_per_epoch)
    return loader


def per_process_validation_data(loader: Any, settings: DataSettings) -> Any:
    """This process's share of the validation loader, cut to ``validation_steps`` batches if asked."""
    if loader is None or settings.validation_steps is None:
        return loader
    return FirstBatches(loader, settings.validation_steps)


__all__ = [
    "EpochSteps",
    "FirstBatches",
    "loader_for",
    "per_process_training_data",
    "per_process_validation_data",
    "training_labels",
    "what_batches_hold",
]


def class_weights_for(model: Any, train_data: Any, class_weight: Any, sample_weight: Any) -> Optional[torch.Tensor]:
    """The class-weight table of a run (or None), once the model's loss is known to weight samples
    when ``class_weight=`` or ``sample_weight=`` asks for it."""
    asked = [
        word
        for word, value in (("class_weight=", class_weight), ("sample_weight=", sample_weight))
        if value is not None
    ]
    if asked and model.uses_default_forward_batch:
        check_weighted_loss(model.loss_fn, " and ".join(asked))
    if class_weight is None:
        return None
    if model.labels_at is not None:
        raise ValueError(
            f"class_weight reads the labels where batches usually hold them, and this model reads them at "
            f"labels_at={model.labels_at!r}. Weight the samples yourself: a dict batch with a 'sample_weight' key "
            "(one weight per sample), or sample_weight= beside arrays."
        )
    return class_weight_table(class_weight, training_labels(train_data))
