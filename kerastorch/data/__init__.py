"""The user's data: one adapter per form it comes in (:mod:`~kerastorch.data.forms`: arrays,
Datasets, iterable datasets, batches the user made), how a batch is read into inputs, labels and
sample weights (:mod:`~kerastorch.data.batches`), arrays in memory (:mod:`~kerastorch.data.arrays`),
the loaders kerastorch builds (over arrays, each batch read with one index per array) and wraps
(:mod:`~kerastorch.data.loaders`), where the training data is inside a pass, for a training state
and a resumed run (:mod:`~kerastorch.data.resumable`), a first look at the data that changes
nothing (:mod:`~kerastorch.data.peek`), per-sample and per-class loss weights
(:mod:`~kerastorch.data.sample_weights`), and validation samples also in the training data
(:mod:`~kerastorch.data.overlap`)."""
