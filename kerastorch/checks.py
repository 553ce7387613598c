"""Everything ``fit`` checks before the first weight changes, with messages for beginners.

Each message says what was wrong, what was expected and what to try.
"""

from __future__ import annotations

import contextlib
import difflib
import os
from typing import Any, Optional

import torch

from .batches import BatchError
from .callbacks.monitor import check_mode


def check_fit_arguments(model, train_data, val_data, epochs, patience, monitor, mode, accumulation_steps,
                        clip_val, clip_algorithm, ckpt_path, verbose, resume=False, callbacks=None) -> None:
    check_loss_fn(model)
    check_optimizer(model)
    check_lr_scheduler(model)
    check_callbacks(callbacks)
    _check_whole_number("epochs", epochs, minimum=0)
    if patience is not None:
        _check_whole_number("patience", patience, minimum=0, hint="or patience=None to never stop early")
    _check_whole_number("gradient_accumulation_steps", accumulation_steps, minimum=1)
    if verbose not in (0, 1, 2, False, True):
        raise ValueError(f"verbose={verbose!r}; use 0 (silent), 1 (progress bars) or 2 (one line per epoch).")
    if clip_val is not None and (not isinstance(clip_val, (int, float)) or isinstance(clip_val, bool) or clip_val <= 0):
        raise ValueError(f"gradient_clip_val={clip_val!r} must be a positive number (or None for no clipping).")
    if clip_algorithm not in ("norm", "value"):
        raise ValueError(f"gradient_clip_algorithm={clip_algorithm!r}; use 'norm' or 'value'.")
    check_mode(mode)
    check_loader(train_data, "train_data")
    if val_data is not None:
        check_loader(val_data, "val_data")
    check_monitor(monitor, model.metrics_dict, has_val=val_data is not None)
    if ckpt_path is not None:
        check_writable(ckpt_path)
    check_resume(resume, ckpt_path)


def check_model_parts(net, loss_fn, lr_scheduler, lr_scheduler_interval) -> None:
    """What KerasModel and LightModel refuse at construction."""
    if not isinstance(net, torch.nn.Module):
        raise TypeError(f"net must be a torch.nn.Module; got a {type(net).__name__}.")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn must be callable, like nn.CrossEntropyLoss(); got a {type(loss_fn).__name__}.")
    if lr_scheduler_interval not in ("epoch", "step"):
        raise ValueError(f"lr_scheduler_interval={lr_scheduler_interval!r}; use 'epoch' or 'step'.")
    if lr_scheduler_interval == "step" and isinstance(lr_scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise ValueError("ReduceLROnPlateau needs an epoch's monitored value; use lr_scheduler_interval='epoch'.")


def check_loss_fn(model) -> None:
    if isinstance(model.loss_fn, type):
        name = model.loss_fn.__name__
        raise TypeError(f"loss_fn is the class {name}, not a loss. Pass an instance: loss_fn=nn.{name}() "
                        "(note the brackets).")
    if model.loss_fn is None and type(model).forward_batch is _default_forward_batch():
        raise ValueError("KerasModel has no loss_fn. Pass one, e.g. KerasModel(net, loss_fn=nn.CrossEntropyLoss()), "
                         "or override forward_batch to compute the loss yourself.")


def check_optimizer(model) -> None:
    """An optimizer object (not its class) that updates at least one of the net's parameters."""
    optimizer = model.optimizer
    example = "torch.optim.Adam(net.parameters(), lr=1e-3)"
    if isinstance(optimizer, type):
        raise TypeError(f"optimizer is the class {optimizer.__name__}, not an optimizer. Build one over the net's "
                        f"parameters: optimizer=torch.optim.{optimizer.__name__}(net.parameters(), lr=1e-3).")
    if not (callable(getattr(optimizer, "step", None)) and callable(getattr(optimizer, "zero_grad", None))
            and isinstance(getattr(optimizer, "param_groups", None), list)):
        raise TypeError(f"optimizer is a {type(optimizer).__name__}, but it must be a torch.optim.Optimizer such as "
                        f"{example}.")
    trainable = {id(p) for p in model.net.parameters() if p.requires_grad}
    updated = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if trainable and not trainable & updated:
        raise ValueError("The optimizer updates none of the net's parameters, so training would change nothing. It "
                         "was probably built for another net (in a notebook: the net's cell was run again after the "
                         f"optimizer's). Build it over this net: optimizer={example}.")


def check_lr_scheduler(model) -> None:
    """A scheduler object (not its class) that drives this model's optimizer."""
    scheduler = model.lr_scheduler
    if scheduler is None:
        return
    example = "torch.optim.lr_scheduler.StepLR(optimizer, step_size=10)"
    if isinstance(scheduler, type):
        raise TypeError(f"lr_scheduler is the class {scheduler.__name__}, not a scheduler. Build one over the "
                        f"optimizer, e.g. lr_scheduler={example}.")
    if not callable(getattr(scheduler, "step", None)):
        raise TypeError(f"lr_scheduler is a {type(scheduler).__name__}, but it must be a torch.optim.lr_scheduler "
                        f"object such as {example}.")
    driven = getattr(scheduler, "optimizer", None)
    if isinstance(driven, torch.optim.Optimizer) and _bare_optimizer(driven) is not _bare_optimizer(model.optimizer):
        raise ValueError("The lr_scheduler drives another optimizer than the model's, so the learning rate would "
                         "never change. Build it over the optimizer you pass to KerasModel: "
                         f"lr_scheduler={example}.")


def _bare_optimizer(optimizer):
    # accelerate's AcceleratedOptimizer keeps the user's optimizer as .optimizer
    while isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer) and optimizer.optimizer is not optimizer:
        optimizer = optimizer.optimizer
    return optimizer


def check_callbacks(callbacks) -> None:
    from .callbacks.base import Callback

    if callbacks is not None and (isinstance(callbacks, Callback) or not isinstance(callbacks, (list, tuple))):
        raise TypeError(f"callbacks is a {type(callbacks).__name__}, but it must be a list of callbacks, e.g. "
                        "callbacks=[kt.callbacks.EarlyStopping('val_loss', patience=3)].")


def check_resume(resume, ckpt_path) -> None:
    from .callbacks.training_state import training_state_path

    if not isinstance(resume, bool):
        raise TypeError(f"resume={resume!r} must be True or False.")
    if not resume:
        return
    if ckpt_path is None:
        raise ValueError("resume=True needs a ckpt_path: the best weights go to that file and the training state "
                         "beside it. Try fit(..., ckpt_path='runs/best.safetensors', resume=True), which keeps the "
                         "state in 'runs/best.safetensors.state'.")
    state_path = training_state_path(ckpt_path)
    if os.path.isdir(state_path):
        raise ValueError(f"The training state goes to {state_path!r}, which is a folder. Move it away, or choose "
                         "another ckpt_path.")


def _default_forward_batch():
    from .model import KerasModel

    return KerasModel.forward_batch


def _check_whole_number(name: str, value: Any, minimum: int, hint: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        extra = f" ({hint})" if hint else ""
        raise ValueError(f"{name}={value!r} must be a whole number >= {minimum}{extra}.")


def run_names(metrics_dict: dict, has_val: bool) -> list[str]:
    """The history columns a run will produce, known before the first batch."""
    names = ["train_loss", *(f"train_{m}" for m in metrics_dict), "lr"]
    if has_val:
        names += ["val_loss", *(f"val_{m}" for m in metrics_dict)]
    return names


def check_monitor(monitor: str, metrics_dict: dict, has_val: bool) -> None:
    names = run_names(metrics_dict, has_val)
    if monitor in names:
        return
    if monitor.startswith("val_") and not has_val and monitor in run_names(metrics_dict, True):
        raise ValueError(f"monitor={monitor!r} needs validation data, but val_data is None. Pass val_data=..., "
                         f"or monitor one of: {', '.join(names)}.")
    close = difflib.get_close_matches(str(monitor), names, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"monitor={monitor!r} is not a value this run produces; available: {', '.join(names)}.{hint}")


def check_loader(data: Any, name: str) -> None:
    _check_not_raw_arrays(data, name)
    if data is None or isinstance(data, (torch.Tensor, str, bytes, dict)) or not hasattr(data, "__iter__"):
        raise TypeError(
            f"{name} is a {type(data).__name__}, but it must be an iterable of batches, such as "
            "torch.utils.data.DataLoader(TensorDataset(x, y), batch_size=32)."
        )
    length = _length(data)
    if length == 0:
        raise ValueError(f"{name} is empty (0 batches). Check the dataset's size, batch_size and drop_last.")


def _check_not_raw_arrays(data: Any, name: str) -> None:
    """A Dataset, an array or a tuple (x, y) where a loader of batches belongs: say how to wrap them."""
    loader = f"DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)"
    if isinstance(data, torch.utils.data.Dataset) and not hasattr(data, "__iter__"):
        raise TypeError(f"{name} is a {type(data).__name__}, a Dataset; fit needs batches. Wrap it: "
                        f"{name}=torch.utils.data.DataLoader(dataset, batch_size=32, shuffle=True).")
    kind = type(data).__module__.split(".")[0]
    if kind in ("numpy", "pandas"):
        raise TypeError(f"{name} is a {kind} {type(data).__name__}; fit needs batches of tensors with labels. Make "
                        f"tensors (torch.as_tensor) and pass torch.utils.data.{loader}.")
    if (isinstance(data, tuple) and 2 <= len(data) <= 3 and all(isinstance(t, torch.Tensor) and t.dim() > 0 for t in data)
            and len({t.shape[0] for t in data}) == 1):
        raise TypeError(f"{name} is a tuple of {len(data)} tensors, like (x, y); fit needs a loader of batches. Pass "
                        f"torch.utils.data.{loader}.")


def check_writable(ckpt_path) -> None:
    if not isinstance(ckpt_path, (str, os.PathLike)):
        raise TypeError(f"ckpt_path={ckpt_path!r} must be a file path (a str or pathlib.Path) like "
                        "'runs/best.safetensors'.")
    path = os.path.abspath(os.fspath(ckpt_path))
    if os.path.isdir(path):
        raise ValueError(f"ckpt_path={os.fspath(ckpt_path)!r} is a folder; give a file path like 'checkpoint.safetensors'.")
    folder = os.path.dirname(path)
    probe = None
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, f".kerastorch-write-test-{os.getpid()}")
        with open(probe, "wb") as f:
            f.write(b"")
    except OSError as error:
        blocker = _file_in_the_way(folder)
        why = (f"{blocker!r} is a file, so it cannot hold a folder" if blocker else
               f"its folder {folder!r} cannot be written ({error.strerror})")
        raise ValueError(f"ckpt_path={os.fspath(ckpt_path)!r} cannot be written: {why}. Choose a path in a folder you "
                         "can write to, e.g. ckpt_path='runs/best.safetensors'.") from None
    finally:
        if probe is not None:
            with contextlib.suppress(OSError):
                os.remove(probe)


def _file_in_the_way(folder: str) -> Optional[str]:
    """The nearest existing ancestor of ``folder``, if it is a file rather than a folder."""
    while folder and not os.path.exists(folder):
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent
    return folder if os.path.isfile(folder) else None


@contextlib.contextmanager
def _rng_untouched(loader: Any):
    """Peeking at a batch must not change the data order of the run that follows."""
    generator = getattr(loader, "generator", None)
    torch_state = torch.random.get_rng_state()
    gen_state = generator.get_state() if isinstance(generator, torch.Generator) else None
    try:
        yield
    finally:
        torch.random.set_rng_state(torch_state)
        if gen_state is not None:
            generator.set_state(gen_state)


def check_first_batch(model, data: Any, runtime, name: str) -> None:
    """Run the first batch through the net and the loss in eval mode, without gradients,
    so a wrong batch layout or a net/loss mismatch fails before any weight changes."""
    with _rng_untouched(data):
        iterator = iter(data)
        try:
            batch = next(iterator)
        except StopIteration:
            raise ValueError(f"{name} produced no batches. Check the dataset's size, batch_size and drop_last.") from None
        finally:
            del iterator
    was_training = model.net.training
    model.net.eval()
    try:
        with torch.no_grad(), runtime.autocast():
            loss, _, _ = model.forward_batch(runtime.to_device(batch))
    except BatchError:
        raise
    except Exception as error:
        message = f"The first batch of {name} failed in the net or the loss, before training started: {error}"
        try:
            wrapped = type(error)(message)
        except Exception:  # an exception type that takes other arguments
            wrapped = RuntimeError(message)
        raise wrapped from error
    finally:
        model.net.train(was_training)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValueError(f"The loss must be a single number (a mean over the batch); got {shape}. Use a loss with "
                         "reduction='mean' or reduce it in forward_batch.")


def _length(data: Any) -> Optional[int]:
    try:
        return len(data)
    except TypeError:
        return None
