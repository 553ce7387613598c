"""How a batch from the user's DataLoader becomes ``net(...)`` inputs, labels and sample weights:
:func:`unpack` is the one reading of a batch that fit, evaluate, the checks and the tools share."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, NamedTuple, Optional, TypeVar, Union

import torch
from accelerate.utils import concatenate, recursively_apply

T = TypeVar("T")

LABEL_KEYS = ("labels", "label", "y")
# Hugging Face's question-answering models are trained by two label keys: the answer's first and last token.
ANSWER_SPAN_KEYS = ("start_positions", "end_positions")
SAMPLE_WEIGHT_KEY = "sample_weight"  # per-sample weights in a dict batch

EXPECTED_BATCHES = (
    "a tuple (x, y), a tuple (x1, ..., xn, y) for a net with n inputs, "
    f"or a dict with one of the keys {', '.join(repr(k) for k in LABEL_KEYS)} for the labels "
    "and the net's keyword arguments as the other keys"
)


class BatchError(ValueError):
    """A batch that kerastorch cannot split into inputs and labels."""


def _describe(batch: Any) -> str:
    if isinstance(batch, torch.Tensor):
        return f"a bare tensor of shape {tuple(batch.shape)}"
    if isinstance(batch, Mapping):
        return f"a dict with keys {sorted(map(str, batch))}"
    if isinstance(batch, (list, tuple)):
        return f"a {type(batch).__name__} of length {len(batch)}"
    return f"a {type(batch).__name__}"


def check_labels_at(labels_at: Any) -> Optional[Union[int, str]]:
    """``labels_at``: where a batch holds its labels. None reads the usual layouts (the last item of
    a tuple; a ``labels``, ``label`` or ``y`` key of a dict), an int is a position in a tuple, a str a
    key of a dict.

    >>> check_labels_at(0), check_labels_at("target"), check_labels_at(None)
    (0, 'target', None)
    """
    if labels_at is None or (isinstance(labels_at, int) and not isinstance(labels_at, bool)):
        return labels_at
    if isinstance(labels_at, str) and labels_at:
        return labels_at
    raise TypeError(
        f"labels_at={labels_at!r}; give the position of the labels in a tuple batch (labels_at=0 for "
        "(labels, x1, x2) batches), the key of the labels in a dict batch (labels_at='target'), or None for "
        "the usual layouts ((x, y), (x1, ..., xn, y), a dict with a 'labels' key)."
    )


INPUTS_AS = ("keywords", "dict")


def check_inputs_as(inputs_as: Any) -> str:
    """``inputs_as``: how a dict batch's inputs reach the net. ``"keywords"`` calls ``net(**inputs)``,
    ``"dict"`` calls ``net(inputs)``: one dict, for a net whose ``forward`` takes one (``forward(self, x)``).

    >>> check_inputs_as("dict")
    'dict'
    """
    if inputs_as in INPUTS_AS:
        return inputs_as
    raise ValueError(
        f"inputs_as={inputs_as!r}; give 'keywords' (the default: a dict batch's inputs go to the net as keyword "
        "arguments, net(a=..., b=...)) or 'dict' (they go as one dict, net({'a': ..., 'b': ...}), for a net whose "
        "forward takes one dict)."
    )


def _position(batch: Any, labels_at: int) -> int:
    """``labels_at`` as a position from 0 in this tuple batch, or a BatchError that says why not."""
    position = labels_at + len(batch) if labels_at < 0 else labels_at
    if not 0 <= position < len(batch) or len(batch) < 2:
        raise BatchError(
            f"Got {_describe(batch)} as a batch, but labels_at={labels_at} asks for the labels at position "
            f"{labels_at}, and the batch needs them and at least one input. Check labels_at, or what your "
            "Dataset or collate_fn returns."
        )
    return position


def split_batch(batch: Any, labels_at: Optional[Union[int, str]] = None) -> tuple[tuple, dict, Any]:
    """Return ``(args, kwargs, labels)`` so that the net is called as ``net(*args, **kwargs)``."""
    if isinstance(batch, Mapping):
        if isinstance(labels_at, int):
            raise BatchError(
                f"Got {_describe(batch)} as a batch, but labels_at={labels_at} is a position in a tuple. For dict "
                "batches give the labels' key: labels_at='target'."
            )
        for key in (labels_at,) if labels_at is not None else LABEL_KEYS:
            if key in batch:
                kwargs = {k: v for k, v in batch.items() if k != key}
                return (), kwargs, batch[key]
        if labels_at is not None:
            raise BatchError(
                f"Got {_describe(batch)} as a batch, but labels_at={labels_at!r} is none of its keys. Give the key "
                "that holds the labels."
            )
    elif isinstance(batch, (list, tuple)) and len(batch) >= 2:
        if isinstance(labels_at, str):
            raise BatchError(
                f"Got {_describe(batch)} as a batch, but labels_at={labels_at!r} is a dict key. For tuple batches "
                "give the labels' position: labels_at=0 for (labels, x1, x2)."
            )
        position = len(batch) - 1 if labels_at is None else _position(batch, labels_at)
        return tuple(batch[:position]) + tuple(batch[position + 1 :]), {}, batch[position]
    raise BatchError(
        f"Got {_describe(batch)} as a batch, which has no labels. kerastorch expects {EXPECTED_BATCHES}."
        + (labels_at_hint(batch) if isinstance(batch, Mapping) else "")
        + " Make your Dataset return (features, label), or override KerasModel.forward_batch for another layout "
        "(or train_step, which needs no labels, for a GAN or an autoencoder of your own)."
    )


def labels_at_hint(batch: Mapping) -> str:
    """For a dict batch without a labels key: the keys that look like labels, and the ``labels_at`` that
    reads them ("" when none does). Hugging Face's names: a key with ``label`` in it, or a question-answering
    model's ``start_positions`` and ``end_positions``.

    >>> "pass labels_at='start_positions'" in labels_at_hint({"input_ids": 0, "start_positions": 1, "end_positions": 2})
    True
    >>> labels_at_hint({"input_ids": 0})
    ''
    """
    keys = [key for key in batch if isinstance(key, str)]
    span = [key for key in ANSWER_SPAN_KEYS if key in keys]
    found = span or [key for key in keys if "label" in key.lower()]
    if not found:
        return ""
    named = " and ".join(repr(key) for key in found)
    plural = len(found) > 1
    if span:
        what = f"{named} {'are' if plural else 'is'} the labels of a question-answering model (Hugging Face's names)"
    else:
        what = f"{named} look{'' if plural else 's'} like labels"
    others = f", {' and '.join(repr(key) for key in found[1:])} included," if plural else ""
    return (
        f" Its key{'s' if plural else ''} {what}: pass labels_at={found[0]!r} to read them. With loss_fn=None the "
        f"net then gets the whole batch{others} and its output's loss trains it; the metrics get {found[0]!r}."
    )


def split_inputs(batch: Any, labels_at: Optional[Union[int, str]] = None) -> tuple[tuple, dict]:
    """Inputs only, for ``predict``: labels, if the batch has them, are dropped.

    A bare tensor, a 1-tuple or a dict without a label key is all inputs. A tuple of
    two or more is read as fit reads it, the last item (or the one at ``labels_at``) being the
    labels; a net with several inputs and no labels should get a dict. Sample weights are dropped too.
    """
    if isinstance(batch, torch.Tensor):
        return (batch,), {}
    batch, _ = split_sample_weight(batch)
    if isinstance(batch, Inputs):
        return tuple(batch.args), {}
    if isinstance(batch, Mapping):
        keys = (labels_at,) if isinstance(labels_at, str) else LABEL_KEYS
        return (), {k: v for k, v in batch.items() if k not in keys}
    if isinstance(batch, (list, tuple)):
        if len(batch) == 1:
            return (batch[0],), {}
        args, _, _ = split_batch(batch, labels_at if isinstance(labels_at, int) else None)
        return args, {}
    raise BatchError(
        f"Got {_describe(batch)} as a batch for predict; expected a tensor of inputs or {EXPECTED_BATCHES}."
    )


def describe_tensor(value: Any) -> str:
    """One item of a batch in a few words: ``int64 (8,)`` for a tensor.

    >>> describe_tensor(torch.zeros(8, dtype=torch.long)), describe_tensor([1, 2])
    ('int64 (8,)', 'a list of 2')
    """
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).replace('torch.', '')} {tuple(value.shape)}"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    return f"a {type(value).__name__}"


def describe_batch(batch: Any) -> str:
    """A batch in a few words, item by item: ``a tuple of 1: batch[0]: float32 (64, 2)``.

    >>> describe_batch({"x": torch.zeros(4, 2)})
    "a dict: batch['x']: float32 (4, 2)"
    """
    plain, weight = split_sample_weight(batch)
    if isinstance(plain, Mapping):
        items = ", ".join(f"batch[{k!r}]: {describe_tensor(v)}" for k, v in plain.items())
        said = f"a dict: {items}"
    elif isinstance(plain, (list, tuple)):
        items = ", ".join(f"batch[{i}]: {describe_tensor(v)}" for i, v in enumerate(plain))
        said = f"a {type(plain).__name__} of {len(plain)}: {items}"
    else:
        said = f"{describe_tensor(plain)}" if isinstance(plain, torch.Tensor) else _describe(plain)
    return said + (" (with sample weights)" if weight is not None else "")


def describe_reading(
    batch: Any, labels_at: Optional[Union[int, str]] = None, labels_to_net: bool = False, one_dict: bool = False
) -> str:
    """What kerastorch did with a batch, in the words of the batch itself: the call of the net with
    each input's dtype and shape, and where the labels came from (``one_dict``: a dict batch's inputs
    went to the net as one dict, ``KerasModel(inputs_as="dict")``).

    >>> describe_reading((torch.zeros(8, dtype=torch.long), torch.zeros(20, dtype=torch.long), torch.zeros(8)))
    'net(batch[0], batch[1]) with batch[0]: int64 (8,), batch[1]: int64 (20,); labels = batch[2]: float32 (8,)'
    """
    plain, weight = split_sample_weight(batch)
    if isinstance(plain, Mapping):
        key = next(
            (k for k in ((labels_at,) if isinstance(labels_at, str) else LABEL_KEYS) if k in plain),
            None,
        )
        called = [k for k in plain if k != key or labels_to_net]
        inputs = (
            "{" + ", ".join(f"{k!r}: ..." for k in called) + "}" if one_dict else ", ".join(f"{k}=..." for k in called)
        )
        shapes = ", ".join(f"{k}: {describe_tensor(plain[k])}" for k in called)
        if key is None:
            said = f"net({inputs}) with {shapes}; no labels"
        elif labels_to_net:
            said = f"net({inputs}) with {shapes} (the labels, {key!r}, included)"
        else:
            said = f"net({inputs}) with {shapes}; labels = batch[{key!r}]: {describe_tensor(plain[key])}"
    elif isinstance(plain, (list, tuple)) and len(plain) >= 2:
        try:
            position = len(plain) - 1 if not isinstance(labels_at, int) else _position(plain, labels_at)
        except BatchError:
            return f"{_describe(plain)}, which labels_at={labels_at!r} does not fit"
        called = [i for i in range(len(plain)) if i != position]
        inputs = ", ".join(f"batch[{i}]" for i in called)
        shapes = ", ".join(f"batch[{i}]: {describe_tensor(plain[i])}" for i in called)
        said = f"net({inputs}) with {shapes}; labels = batch[{position}]: {describe_tensor(plain[position])}"
    else:
        return _describe(plain)
    return said + ("; sample weights beside them" if weight is not None else "")


def inputs_count(batch: Any, labels_at: Optional[Union[int, str]] = None) -> int:
    """How many samples a batch holds, read from its inputs' shapes (no device sync): the first
    dimension of the first input, or the length of a list of inputs (a detector's images); for a
    batch without labels (a ``train_step`` of the user's own), the first tensor's.

    >>> inputs_count((torch.zeros(3, 2), [{"boxes": torch.zeros(0, 4)}] * 3))
    3
    """
    try:
        args, kwargs = split_inputs(batch, labels_at)
    except BatchError:
        args, kwargs = (batch,), {}
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            if value.dim() > 0:
                return value.shape[0]
        elif isinstance(value, (list, tuple)) and value:
            first = first_tensor(value)
            return first.shape[0] if isinstance(value, tuple) and first is not None and first.dim() > 0 else len(value)
    tensor = first_tensor(batch)
    return tensor.shape[0] if tensor is not None and tensor.dim() > 0 else 1


def first_tensor(obj: Any):
    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, Mapping):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        for item in obj:
            found = first_tensor(item)
            if found is not None:
                return found
    return None


# Nested outputs (tuples, lists, namedtuples, dicts and their subclasses) are walked
# with accelerate's recursively_apply, which rebuilds each container as its own type.


def detach(outputs: Any) -> Any:
    """``outputs`` with every tensor detached from the graph (the common bare tensor first: it runs every step)."""
    if isinstance(outputs, torch.Tensor):
        return outputs.detach()
    return recursively_apply(torch.Tensor.detach, outputs)


def _host_copy(tensor: torch.Tensor) -> torch.Tensor:
    out = tensor.detach().to("cpu")
    if out.dtype in (torch.float16, torch.bfloat16):
        out = out.float()  # what every consumer of predictions accepts
    return out


def to_host(outputs: Any) -> Any:
    """``outputs`` copied to the CPU, half precision as float32, shapes as they are."""
    return recursively_apply(_host_copy, outputs)


def _as_rows(tensor: torch.Tensor, single_sample: bool) -> torch.Tensor:
    if single_sample:
        return tensor.unsqueeze(0)  # one sample's output is one row
    return tensor.reshape(1) if tensor.dim() == 0 else tensor  # a scalar per batch concatenates to one per batch


def _leaf_shapes(outputs: Any, path: str = "outputs") -> list[tuple[str, tuple[int, ...]]]:
    """Where each tensor of a structure of outputs sits (``outputs['logits']``, ``outputs[0]``) and its shape."""
    if isinstance(outputs, torch.Tensor):
        return [(path, tuple(outputs.shape))]
    if isinstance(outputs, Mapping):
        return [leaf for key, value in outputs.items() for leaf in _leaf_shapes(value, f"{path}[{key!r}]")]
    if isinstance(outputs, (tuple, list)):
        return [leaf for i, value in enumerate(outputs) for leaf in _leaf_shapes(value, f"{path}[{i}]")]
    return []


class OutputRows:
    """``predict``'s outputs, one batch after another, concatenated at the end into one structure with
    a row per sample (accelerate's ``concatenate``, which keeps each container's type).

    ``held`` says what each batch is (:func:`~kerastorch.data.loaders.what_batches_hold`): for
    ``"samples"`` (a DataLoader with ``batch_size=None`` over rows of arrays) each output gets a first
    dimension of one, so the samples' outputs are stacked; for ``"items"`` (``batch_size=None`` over
    another dataset, whose items may be samples or batches) the items are joined as batches only when
    the net's outputs have a row per input row, and refused otherwise, since stacking and concatenating
    would both be guesses. Each batch's shapes are compared with the first batch's as it comes (shapes
    only, no device sync): outputs that differ past the first dimension, as a tagger's on sequences
    padded per batch do, are refused at that batch, saying what differs and what to do, not after the
    whole data set inside ``torch.cat``.
    """

    def __init__(self, held: str = "batches"):
        self.single_samples = held == "samples"
        self.check_rows = held == "items"
        self.batches: list = []
        self._first_shapes: list[tuple[str, tuple[int, ...]]] = []

    def append(self, outputs: Any, batch: Any = None) -> None:
        """Keep one batch's outputs (on the CPU), refusing them if they cannot join the earlier ones."""
        if self.check_rows:
            self._refuse_unless_rows(outputs, batch)
        rows = recursively_apply(_as_rows, outputs, single_sample=self.single_samples)
        shapes = _leaf_shapes(rows)
        if not self.batches:
            self._first_shapes = shapes
        elif [(where, shape[1:]) for where, shape in shapes] != [(w, s[1:]) for w, s in self._first_shapes]:
            raise ValueError(self._mismatch(len(self.batches), shapes))
        self.batches.append(rows)

    def _refuse_unless_rows(self, outputs: Any, batch: Any) -> None:
        given, made = first_tensor(batch), first_tensor(outputs)
        if given is None or made is None:
            return
        if given.dim() > 0 and made.dim() > 0 and given.shape[0] == made.shape[0]:
            return
        raise ValueError(
            "predict cannot tell whether this DataLoader's items are samples or batches: with batch_size=None "
            "(automatic batching off) it hands each item of its dataset to the net as it is, and for item "
            f"{len(self.batches)} the input has shape {tuple(given.shape)} and the net's output "
            f"{tuple(made.shape)}, not one row per input row as a batch's outputs have. For a dataset of "
            "samples, let the DataLoader batch them: DataLoader(dataset, batch_size=32), or a TensorDataset, "
            "whose items predict stacks; for batches your dataset makes itself, the net's outputs need one "
            "row per input row. predict(data, concatenate=False) returns each item's outputs as a list."
        )

    def concatenated(self) -> Any:
        return concatenate(self.batches)

    def _mismatch(self, index: int, shapes: list[tuple[str, tuple[int, ...]]]) -> str:
        unit = "sample" if self.single_samples else "item" if self.check_rows else "batch"
        first = dict(self._first_shapes)
        if [where for where, _ in shapes] != list(first):
            said = (
                f"{unit} 0's outputs hold {', '.join(first) or 'no tensor'} and {unit} {index}'s hold "
                f"{', '.join(where for where, _ in shapes) or 'no tensor'}"
            )
        else:
            where, shape = next((w, s) for w, s in shapes if s[1:] != first[w][1:])
            drop = 1 if self.single_samples else 0  # a sample's own shape, without the row added here
            said = f"the shape of {where} is {first[where][drop:]} in {unit} 0 and {shape[drop:]} in {unit} {index}"
        if self.single_samples:
            rule = "A DataLoader with batch_size=None over rows hands the net one sample at a time, and the "
            rule += "samples' outputs are stacked, so they must have one shape"
        else:
            rule = "The batches' outputs join along the first (batch) dimension, so every other dimension must match"
        return (
            f"predict cannot concatenate the net's outputs: {said}. {rule} (outputs on sequences padded per batch "
            f"differ in length). Pass concatenate=False for a list with each {unit}'s outputs: "
            "model.predict(data, concatenate=False); or make the outputs the same size past the first dimension "
            "(pad every sequence to one length in the collate_fn)."
        )


class Inputs(NamedTuple):
    """Several inputs of the net and no labels: what ``predict([X1, X2])``'s loader yields (Keras's
    rule: predict has no labels, every array is an input). The default collate keeps the type."""

    args: tuple


class WeightedSample(NamedTuple):
    """A batch (or sample) with per-sample weights: what kerastorch's own loaders yield when
    ``fit`` is given ``sample_weight`` or ``class_weight``. The default collate keeps the
    type, so a batch of these is one of these with batched fields."""

    sample: Any
    weight: torch.Tensor


def split_sample_weight(batch: Any) -> tuple[Any, Optional[torch.Tensor]]:
    """``(batch without weights, weights or None)``: a :class:`WeightedSample`, or a dict with a
    ``sample_weight`` key (the dict-batch way of giving weights)."""
    if isinstance(batch, WeightedSample):
        return batch.sample, batch.weight
    if isinstance(batch, Mapping) and SAMPLE_WEIGHT_KEY in batch:
        return {k: v for k, v in batch.items() if k != SAMPLE_WEIGHT_KEY}, batch[SAMPLE_WEIGHT_KEY]
    return batch, None


def labels_to_outputs(labels: Any, preds: Any) -> Any:
    """Tensor labels on the device of the net's output (a no-op when they share one, as they do
    unless the net's pieces sit on several devices)."""
    if not isinstance(labels, torch.Tensor):
        return labels
    if isinstance(preds, torch.Tensor) and preds.device == labels.device:
        return labels  # the common case, checked first: it runs every step
    out = first_tensor(preds)
    if out is None or labels.device == out.device:
        return labels
    return labels.to(out.device, non_blocking=True)


class Unpacked(NamedTuple):
    """A batch as kerastorch reads it: the net is called ``net(*args, **kwargs)``; ``labels`` go to the
    loss and the metrics; ``weight`` holds the samples' weights (None without any)."""

    args: tuple
    kwargs: dict
    labels: Any
    weight: Optional[torch.Tensor]


def unpack(batch: Any, labels_at: Optional[Union[int, str]] = None) -> Unpacked:
    """Read a batch: ``(x, y)``, ``(x1, ..., xn, y)`` or a dict with a labels key, with sample weights
    (a :class:`WeightedSample`, or a ``sample_weight`` key) or without. ``labels_at`` (a model's
    ``KerasModel(labels_at=...)``) says where else the labels are: a position in a tuple, a key in a dict.

    >>> unpack((torch.zeros(2, 3), torch.tensor([0, 1]))).labels
    tensor([0, 1])
    >>> unpack((torch.tensor([0, 1]), torch.zeros(2, 3)), labels_at=0).labels
    tensor([0, 1])
    """
    plain, weight = split_sample_weight(batch)
    args, kwargs, labels = split_batch(plain, labels_at)
    return Unpacked(args, kwargs, labels, weight)


# -- micro-batches: a batch cut into pieces by samples, and the pieces' outputs joined -------------


def samples_in_batch(batch: Any, labels_at: Optional[Union[int, str]] = None) -> int:
    """How many samples a batch holds: the first dimension of its labels, the length of a list of
    them (a detector's targets, a dict per image), else what :func:`inputs_count` reads.

    >>> samples_in_batch((torch.zeros(5, 3), torch.zeros(5))), samples_in_batch(torch.zeros(4, 2))
    (5, 4)
    """
    try:
        labels = unpack(batch, labels_at).labels
    except BatchError:
        labels = None
    if isinstance(labels, torch.Tensor) and labels.dim() > 0:
        return labels.shape[0]
    if isinstance(labels, (list, tuple)) and labels and not isinstance(labels[0], torch.Tensor):
        return len(labels)
    return inputs_count(batch, labels_at)


def batch_rows(batch: Any, start: int, stop: int, size: int) -> Any:
    """Samples ``start..stop`` of a batch of ``size`` samples: every tensor with a row per sample is cut
    along its first dimension, every list or tuple with an item per sample (a detector's images and
    targets, a text batch's strings) is cut as a list; containers keep their type; a number, a string
    or a 0-d tensor goes whole to every piece. (A batch's own layout is a container: ``(x, y)`` is
    never read as two samples.) A tensor with another first dimension (the flat tokens and offsets of
    a text batch for ``nn.EmbeddingBag``) has no row per sample: :class:`BatchError`, naming it.

    >>> batch_rows((torch.arange(6).reshape(3, 2), [{"id": 0}, {"id": 1}, {"id": 2}]), 1, 3, 3)
    (tensor([[2, 3],
            [4, 5]]), [{'id': 1}, {'id': 2}])
    """
    return _rows(batch, start, stop, size, "batch", layout=True)


def _rows(value: Any, start: int, stop: int, size: int, where: str, layout: bool = False) -> Any:
    if isinstance(value, torch.Tensor):
        if value.dim() == 0:
            return value
        if value.shape[0] == size:
            return value[start:stop]
        raise BatchError(
            f"{where} has {value.shape[0]} rows, but the batch holds {size} samples: it cannot be cut into "
            "micro-batches of fewer samples. Give it a row per sample (pad the sequences of a text batch to one "
            "length instead of flat tokens and offsets), or a batch_size that fits in memory."
        )
    if isinstance(value, Mapping):
        return type(value)({k: _rows(v, start, stop, size, f"{where}[{k!r}]") for k, v in value.items()})  # type: ignore[call-arg]
    if isinstance(value, (list, tuple)):
        if not layout and _one_item_per_sample(value, size):
            return value[start:stop]
        items = [_rows(v, start, stop, size, f"{where}[{i}]") for i, v in enumerate(value)]
        return type(value)(*items) if _is_named_tuple(value) else type(value)(items)
    return value


def on_fewer_samples(run: Callable[[Any], T], batch: Any, labels_at: Optional[Union[int, str]] = None) -> T:
    """``run(batch)``, or, when it runs out of memory, ``run`` on the batch's first half, quarter, ...
    sample (for a check that needs some of a batch's samples, not all): one sample's error is raised."""
    n = size = samples_in_batch(batch, labels_at)
    while True:
        try:
            return run(batch if size == n else batch_rows(batch, 0, size, n))
        except torch.OutOfMemoryError:
            if size <= 1:
                raise
        size = (size + 1) // 2  # once the error is gone, with the memory it held


def joined_rows(pieces: list, sizes: list[int]) -> Any:
    """The outputs of consecutive pieces of a batch (``sizes`` samples each) joined as :func:`batch_rows`
    cut them: tensors along their first dimension, lists with an item per sample one after the other,
    containers item by item; a 0-d tensor (a piece's mean, such as its loss) becomes the batch's mean,
    each piece's weighted by its share of the samples.

    >>> joined_rows([(torch.tensor(1.0), torch.zeros(1, 2)), (torch.tensor(4.0), torch.ones(3, 2))], [1, 3])
    (tensor(3.2500), tensor([[0., 0.],
            [1., 1.],
            [1., 1.],
            [1., 1.]]))
    """
    return _joined(pieces, sizes, layout=True)


def _joined(pieces: list, sizes: list[int], layout: bool = False) -> Any:
    first = pieces[0]
    if isinstance(first, torch.Tensor):
        if first.dim() > 0:
            return torch.cat(pieces)
        total = sum(sizes)
        return sum(piece * (n / total) for piece, n in zip(pieces, sizes))
    if isinstance(first, Mapping):
        return type(first)({k: _joined([piece[k] for piece in pieces], sizes) for k in first})  # type: ignore[call-arg]
    if isinstance(first, (list, tuple)):
        if not layout and all(_one_item_per_sample(piece, n) for piece, n in zip(pieces, sizes)):
            return type(first)(item for piece in pieces for item in piece)
        items = [_joined([piece[i] for piece in pieces], sizes) for i in range(len(first))]
        return type(first)(*items) if _is_named_tuple(first) else type(first)(items)
    return first


def _one_item_per_sample(value: Union[list, tuple], size: int) -> bool:
    """A list or tuple of ``size`` items that are not the rows of several inputs (``(x1, x2)`` whose
    tensors each have ``size`` rows)."""
    if _is_named_tuple(value) or len(value) != size:
        return False
    return not all(isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == size for v in value)


def _is_named_tuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")
