"""Several devices from a notebook or a plain ``python`` process.

Inside a job started by ``torchrun`` or ``accelerate launch``, ``fit`` simply runs as
one rank. Starting the k processes ourselves from an interactive session is the
work of this module.
"""

from __future__ import annotations


def several_devices_error(chosen: list[int], device_type: str) -> Exception:
    return NotImplementedError(
        f"devices={chosen} asks for {len(chosen)} {device_type} devices from a single process. "
        "Start the script with `accelerate launch --num_processes "
        f"{len(chosen)} script.py` or `torchrun --nproc_per_node {len(chosen)} script.py`, "
        "or pass devices=1."
    )
