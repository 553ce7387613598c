"""When memory runs out: a batch redone as micro-batches, with the same update.

A training step that raises ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError`` is the same
class) is not the end of a run under ``fit(on_oom="split")``, the default. What the failed attempt
held is freed, and the same batch is trained again as micro-batches of half its samples (then a
quarter, ... down to one): each micro-batch's loss is weighted by its share of the batch's samples,
their gradients add up to the whole batch's, and the optimizer steps once, at the end. The update is
the one the whole batch makes, up to the order of float sums; the meters get the micro-batches'
outputs joined, so the history is the same too. The run says it once and keeps the micro-batch size
for its other batches (it does not try whole batches again). Evaluation and ``predict`` do the same
without gradients: smaller pieces, outputs joined in data order.

Which rows are done is what makes it exact. An attempt that fails before its backward pass changed no
gradient: the batch goes on from its first row not yet done, in smaller pieces. One that fails in its
backward pass has added part of its gradients: the batch starts again, its gradients zeroed, which
only the first batch of an accumulation group may do (the later ones would lose the group's earlier
gradients with them: refused, saying so). Data order and random generators are not touched; a net
with dropout draws its masks for the pieces as for any batch.

Several processes (DDP): the process that ran out redoes its batch alone, and the gradient exchange
still matches the others': its pieces run under ``no_sync`` but the last, whose backward pass
exchanges the batch's summed gradients as the others' whole batch does, and its forward passes
broadcast buffers no more often than theirs (:meth:`~kerastorch.strategies.base.Strategy.forward_failed`).
Nothing is exchanged on a step that did not fail. At the end of each epoch the processes take the
smallest micro-batch size any of them reached. A backward pass that ran out while the processes
exchanged its gradients cannot be taken back by one process: refused, saying what to do. FSDP
gathers weights inside the forward pass: refused (:attr:`~kerastorch.strategies.base.Strategy.split_refusal`).

Refused too, each with a message that says what to do: a batch of one sample; a ``train_step`` of
the user's own; an optimizer step that ran out (smaller batches do not help it); and, unless
``on_oom="split_batchnorm"``, a net with BatchNorm layers in training mode, which would normalise
over micro-batches.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Optional

import torch

from ..data.batches import batch_rows, detach, joined_rows, samples_in_batch
from ..strategies import unwrap

BATCH_NORMS = (
    torch.nn.BatchNorm1d,
    torch.nn.BatchNorm2d,
    torch.nn.BatchNorm3d,
    torch.nn.SyncBatchNorm,
    torch.nn.LazyBatchNorm1d,
    torch.nn.LazyBatchNorm2d,
    torch.nn.LazyBatchNorm3d,
)


class StepFailure(NamedTuple):
    """A training attempt that ran out of memory: in which part of the step, and why its batch cannot be
    redone in pieces (None: it can)."""

    phase: str  # "forward", "backward" or "update"
    refusal: Optional[str]


def failure_of(step: Any, error: BaseException, batch_index: int, n: int) -> StepFailure:
    """What a failed attempt of ``step`` (a :class:`~kerastorch.training.loop.FitStep`) on batch
    ``batch_index`` of ``n`` samples means for it. Called while the error is handled; the memory the
    attempt held is freed after."""
    phase, where = step.phase, f"Batch {batch_index + 1} of epoch {step.epochs_done}"
    size = step.micro_batch or n
    same = f"batch_size={max(size // 2, 1)}, gradient_accumulation_steps={2 * step.accumulate}"
    advice = f"fit(..., {same}) updates as batches of {size} do, in about half the memory"
    refusal = None
    if not step.model.uses_default_train_step:
        refusal = (
            f"{where} ran out of memory in your train_step. fit does not cut a train_step of your own into "
            "micro-batches, since how its losses add up is yours to say; smaller batches with gradient accumulation "
            f"do it with the same model.backward and model.optimizer_step calls: {advice}."
        )
    elif step.runtime.strategy.split_refusal:
        refusal = f"{where} ran out of memory, and {step.runtime.strategy.split_refusal}. Smaller batches: {advice}."
    elif phase == "update":
        refusal = (
            f"{where} ran out of memory in the optimizer's step. Micro-batches cannot help there: the step's memory "
            "(the weights, their gradients, the optimizer's state such as Adam's two averages) does not depend on "
            "the batch. Free memory for the net: a smaller one, precision='bf16-true', or an optimizer with less "
            "state (SGD)."
        )
    elif phase == "backward" and step.waiting > 1:
        refusal = (
            f"{where} ran out of memory in its backward pass, after {step.waiting - 1} earlier batch(es) of its "
            f"accumulation group (gradient_accumulation_steps={step.accumulate}) had added their gradients: part "
            "of this batch's is added to them, and cannot be taken back to redo it in micro-batches. Start again "
            f"with smaller batches: {advice}."
        )
    elif phase == "backward" and step.runtime.num_processes > 1 and step.updates_now:
        refusal = (
            f"{where} ran out of memory in its backward pass, while the processes exchanged its gradients: one "
            f"process cannot take that back and redo it alone. Start again with smaller batches: {advice}."
        )
    elif step.on_oom == "split":
        norms = batch_norms_in_training(step.model.net)
        if norms:
            refusal = (
                f"{where} ran out of memory, and the net has BatchNorm layers that normalise over the batch in "
                f"training ({', '.join(norms[:3])}{', ...' if len(norms) > 3 else ''}): in micro-batches they "
                "would normalise over fewer samples, and the update would differ from the whole batch's. Pass "
                "fit(..., on_oom='split_batchnorm') to split anyway (each micro-batch normalised over its own "
                f"samples, as with fit(..., {same})), or use smaller batches: {advice}."
            )
    if refusal is not None:
        refusal += f" (torch: {error})"
    return StepFailure(phase, refusal)


def batch_norms_in_training(net: torch.nn.Module) -> list[str]:
    """The names of the net's BatchNorm layers in training mode (a frozen one, in eval mode, normalises
    each sample with its running statistics, whatever the batch)."""
    return [name for name, m in unwrap(net).named_modules() if isinstance(m, BATCH_NORMS) and m.training]


def train_in_pieces(step: Any, batch: Any, batch_index: int, failure: Optional[StepFailure] = None) -> Any:
    """``step.train`` on consecutive pieces of ``batch`` of ``step.micro_batch`` samples (the first, when
    ``failure`` says why, after making them smaller); returns the pieces' ``(loss, preds, labels)``
    joined as the whole batch's. Only the last piece of a batch that ends an accumulation group
    updates; each piece's loss counts by its share of the samples (``step.share``, in ``backward``)."""
    n = samples_in_batch(batch, step.model.labels_at)
    group_ends, size_before = step.updates_now, step.micro_batch
    start = 0  # the rows done, and their pieces' outputs and sizes:
    done: list[Any] = []
    sizes: list[int] = []
    try:
        while start < n or failure is not None:
            if failure is not None:
                if failure.phase == "backward":  # its gradients are spoilt: the batch starts again, from none
                    step.model.optimizer.zero_grad(set_to_none=True)
                    step.model.net.zero_grad(set_to_none=True)
                    start, done, sizes = 0, [], []
                smaller_pieces(step, failure, n, batch_index)
                failure = None
                continue
            stop = min(start + (step.micro_batch or n), n)
            piece = batch if stop - start == n else batch_rows(batch, start, stop, n)
            step.share = (stop - start) / n
            step.updates_now = group_ends and stop == n
            try:
                outputs = step.train(piece)
            except torch.OutOfMemoryError as error:
                failure = failure_of(step, error, batch_index, n)
                continue
            done.append(detach(outputs))
            sizes.append(stop - start)
            start = stop
    finally:
        step.share, step.updates_now = 1.0, group_ends
    if step.micro_batch != size_before and step.say is not None:
        step.say(
            f"Batch {batch_index + 1} of epoch {step.epochs_done} ran out of memory ({n} samples): fit trained it, "
            f"and trains every batch after it, as micro-batches of {step.micro_batch} samples. Their gradients add "
            f"up to the same update as the whole batch's (batch_size stays {n}), a little slower. on_oom='raise' "
            "turns this off."
        )
    return done[0] if len(done) == 1 else joined_rows(done, sizes)


def smaller_pieces(step: Any, failure: StepFailure, n: int, batch_index: int) -> None:
    """After a failed attempt (whose error is gone): free what it held, then raise its refusal, or make
    the micro-batches smaller."""
    free_memory()
    step.runtime.strategy.forward_failed(step.model.net)
    if failure.refusal is not None:
        raise torch.OutOfMemoryError(failure.refusal)
    size = step.micro_batch or n
    if size <= 1:
        raise torch.OutOfMemoryError(
            f"Batch {batch_index + 1} of epoch {step.epochs_done} ran out of memory in micro-batches of one "
            f"sample: one sample alone does not fit. {FREE_MEMORY}"
        )
    step.micro_batch = smaller(size, n)


FREE_MEMORY = (
    "Free memory for it: smaller inputs or a smaller net, precision='bf16-mixed' (activations in half the memory), "
    "or release what else holds the device's memory (another notebook's model)."
)


def smaller(size: int, n: int) -> int:
    """The next micro-batch size for a batch of ``n`` samples: twice as many pieces (2, 4, ...).

    >>> smaller(64, 64), smaller(32, 64), smaller(3, 5), smaller(2, 5)
    (32, 16, 2, 1)
    """
    pieces = 2 * math.ceil(n / size)
    return max(1, min(size - 1, math.ceil(n / pieces)))


def free_memory() -> None:
    """Give the memory a failed attempt held back to the device: its tensors are freed with its error
    (nothing else refers to them), and the allocator's cache of freed blocks goes back too."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
    if torch.backends.mps.is_available():
        torch.mps.empty_cache()


def agree_on_micro_batch(step: Any) -> None:
    """At an epoch's end, with several processes: every process takes the smallest micro-batch size
    any of them reached (one gather per epoch; nothing per step), and the main process says so when a
    process but itself ran out."""
    runtime = step.runtime
    mine = step.micro_batch or 0
    sizes = runtime.accelerator.gather(torch.tensor([mine], device=runtime.device)).tolist()
    reached = [size for size in sizes if size > 0]
    if not reached or min(reached) == step.micro_batch:
        return
    step.micro_batch = min(reached)
    if step.say is not None:
        ranks = ", ".join(str(rank) for rank, size in enumerate(sizes) if size == step.micro_batch)
        step.say(
            f"Process {ranks} ran out of memory in epoch {step.epochs_done} and trained in micro-batches of "
            f"{step.micro_batch} samples (the same update as whole batches): every process does from now on."
        )


class EvalPieces:
    """The pieces of evaluate, predict and fit's validation: a batch whose forward pass runs out of
    memory is redone in pieces of half its samples (then a quarter, ...), their outputs joined in data
    order, and the pass (in fit, the run's validations) goes on in pieces of that size. ``what`` names
    the pass in messages ("Validation", "evaluate", "predict"); ``splits`` False raises torch's error as
    it comes; ``one_sample`` says each batch is one sample (a DataLoader with ``batch_size=None``)."""

    def __init__(
        self,
        what: str,
        model: Any,
        runtime: Any,
        say: Optional[Callable[[str], Any]],
        splits: bool = True,
        one_sample: bool = False,
    ):
        self.what, self.model, self.runtime, self.say = what, model, runtime, say
        self.splits, self.one_sample = splits, one_sample
        self.size: Optional[int] = None  # samples per piece; None: whole batches

    def forward(self, forward: Callable[[Any], Any], batch: Any) -> Any:
        """``forward(batch)`` under the run's autocast, in pieces when memory ran out."""
        if self.size is None:
            try:
                with self.runtime.autocast():
                    return forward(batch)
            except torch.OutOfMemoryError:
                if not self.splits:
                    raise
        return self.in_pieces(forward, batch, failed=self.size is None)

    def in_pieces(self, forward: Callable[[Any], Any], batch: Any, failed: bool) -> Any:
        n = 1 if self.one_sample else samples_in_batch(batch, self.model.labels_at)
        start, size_before = 0, self.size
        done: list[Any] = []
        sizes: list[int] = []
        while start < n or failed:
            if failed:  # the failed attempt's error is gone, and with it what it held
                self.smaller(n)
                failed = False
                continue
            stop = min(start + (self.size or n), n)
            piece = batch if stop - start == n else batch_rows(batch, start, stop, n)
            try:
                with self.runtime.autocast():
                    outputs = forward(piece)
            except torch.OutOfMemoryError:
                failed = True
                continue
            done.append(outputs)
            sizes.append(stop - start)
            start = stop
        if self.size != size_before and self.say is not None:
            self.say(
                f"{self.what} ran out of memory on a batch of {n} samples: it goes on in pieces of {self.size} "
                "samples, their outputs joined in order (the same values)."
            )
        return done[0] if len(done) == 1 else joined_rows(done, sizes)

    def smaller(self, n: int) -> None:
        free_memory()
        strategy = self.runtime.strategy
        strategy.forward_failed(self.model.net)
        if strategy.split_refusal:
            raise torch.OutOfMemoryError(f"{self.what} ran out of memory on a batch, and {strategy.split_refusal}.")
        size = self.size or n
        if size <= 1:
            raise torch.OutOfMemoryError(
                f"{self.what} ran out of memory on one sample: one sample alone does not fit. {FREE_MEMORY}"
            )
        self.size = smaller(size, n)


__all__ = [
    "EvalPieces",
    "StepFailure",
    "agree_on_micro_batch",
    "batch_norms_in_training",
    "failure_of",
    "smaller",
    "train_in_pieces",
]
