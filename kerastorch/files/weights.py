"""Weight files: written atomically, read without ever running code from the file.

Weights are stored with safetensors, or in torch's own format (a plain dict of tensors)
when the path ends in ``.pt``, ``.pth``, ``.ckpt`` or ``.bin`` or has no extension, as
programs that reload it with ``torch.load`` expect. A file is first written next to its target under
a temporary name, flushed to disk, then renamed over the target, so a crash or a kill
leaves either the old file or the new one, never half of one. Reading accepts
safetensors files and, for files made with ``torch.save(net.state_dict())``,
``torch.load(weights_only=True)``, which refuses pickled code.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from .atomic import atomic_write

SAFETENSORS_MAGIC_MAX = 100_000_000  # a safetensors header length is far below this


# Paths that name torch's own format: programs reload them with net.load_state_dict(torch.load(path)).
TORCH_FORMAT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin")


def writes_torch_format(path: str | os.PathLike) -> bool:
    """True for ``.pt`` / ``.pth`` / ``.ckpt`` / ``.bin`` or no extension; safetensors otherwise.

    >>> writes_torch_format("checkpoint.pt"), writes_torch_format("checkpoint"), writes_torch_format("w.safetensors")
    (True, True, False)
    """
    suffix = os.path.splitext(os.fspath(path))[1].lower()
    return suffix in TORCH_FORMAT_SUFFIXES or suffix == ""


def save_weights(state_dict: dict[str, torch.Tensor], path: str | os.PathLike) -> None:
    """Write a state dict atomically: torch's format (a plain dict of tensors, which
    ``torch.load(path, weights_only=True)`` reads) for ``.pt`` / ``.pth`` / ``.ckpt`` / ``.bin``
    or no extension, safetensors for anything else (``.safetensors``)."""
    tensors = standalone_tensors(state_dict)
    if writes_torch_format(path):
        atomic_write(path, lambda tmp: torch.save(tensors, tmp))
    else:
        atomic_write(path, lambda tmp: save_file(tensors, tmp, metadata={"format": "pt", "writer": "kerastorch"}))


def standalone_tensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The tensors in host memory, each alone in its memory: safetensors refuses tensors that share
    memory (tied weights), and torch's format would write the whole of the memory a view looks into.
    Only those are copied (separate copies load back the same); a tensor alone in its memory already
    (a kept copy of the weights, a net's own parameter) is written as it is, with no copy of a net's
    size made for each file.

    >>> w = torch.ones(2, 2)
    >>> out = standalone_tensors({"a": w, "b": w, "c": w[0]})
    >>> [out[k].data_ptr() == w.data_ptr() for k in "abc"], out["c"].untyped_storage().nbytes()
    ([True, False, False], 8)
    """
    standalone: dict[str, torch.Tensor] = {}
    memory_seen: set[int] = set()
    for key, value in state_dict.items():
        value = value.detach().to("cpu")
        memory = value.untyped_storage()
        alone = (
            value.is_contiguous()
            and value.storage_offset() == 0
            and memory.nbytes() == value.numel() * value.element_size()
            and memory.data_ptr() not in memory_seen
        )
        standalone[key] = value if alone else value.contiguous().clone()
        memory_seen.add(memory.data_ptr())
    return standalone


def _is_safetensors(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(9)
    if len(head) < 9:
        return False
    header_len = int.from_bytes(head[:8], "little")
    return 0 < header_len < SAFETENSORS_MAGIC_MAX and head[8:9] == b"{"


def load_weights(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """Read a weights file without executing anything stored in it."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"No checkpoint at {path!r}. Check the path, or train with fit(..., ckpt_path={path!r}) first."
        )
    if _is_safetensors(path):
        return load_file(path)
    state = load_plain(
        path,
        "{path!r} is neither a safetensors file nor a plain torch state dict that loads with "
        "weights_only=True, so it was not loaded (loading it could run code stored in it): "
        "{reason}.",
    )
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path!r} does not hold a state dict of tensors; save one with model.save_ckpt(path).")
    return state


def load_plain(path: str, refusal: str) -> Any:
    """``torch.load(weights_only=True)``: only plain tensors, numbers and containers are rebuilt,
    never code stored in the file. A refusal raises ``ValueError(refusal.format(path=, reason=))``
    with torch's long message cut to the one reason that matters."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise ValueError(refusal.format(path=path, reason=_refusal_reason(error))) from None


def _refusal_reason(error: Exception) -> str:
    """The line of torch's long weights_only message that says what was refused."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    for line in lines:
        if "GLOBAL" in line or "Unsupported" in line:
            return f"it holds something other than plain values ({line.rstrip('.')})"
    if lines and lines[0].startswith("Weights only load failed"):
        return "it holds something other than plain tensors and numbers"
    return lines[0].split(". ")[0].rstrip(".") if lines else f"{type(error).__name__} (is the file empty or cut short?)"
