"""What a cluster environment is: the launcher that started this process and where the process
sits in its job (:class:`ClusterEnvironment`), the error for a launcher's missing or contradicting
variables, and the reader of environment variables that names the variable a bad value came from.

:func:`~kerastorch.devices.environment.cluster_environment` finds which launcher it is;
:mod:`~kerastorch.devices.slurm` reads SLURM's variables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Optional

DEFAULT_PORT = 29500  # torchrun's, when nothing says which port


class ClusterEnvironmentError(RuntimeError):
    """The launcher's variables are missing or contradict each other."""


@dataclasses.dataclass(frozen=True)
class ClusterEnvironment:
    """Who started this process and where it sits in the job: see :func:`cluster_environment`.

    ``local_world_size`` (processes on this machine), ``node_rank`` and ``num_nodes`` are
    None where the launcher does not say. ``hosts`` is the job's node list, expanded
    (SLURM only). ``warning`` is set when the process runs alone although the launcher
    allocated more (a SLURM batch script with several tasks, not started by ``srun``).
    """

    name: str
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: Optional[int] = 1
    node_rank: Optional[int] = 0
    num_nodes: Optional[int] = 1
    master_addr: str = "127.0.0.1"
    master_port: int = DEFAULT_PORT
    launcher: str = "no launcher"
    job_id: Optional[str] = None
    hosts: tuple[str, ...] = ()
    warning: Optional[str] = None

    @property
    def is_job(self) -> bool:
        """True when this process is one rank of a job of several processes."""
        return self.world_size > 1

    def describe(self) -> str:
        """The short text ``fit``'s first line prints: the launcher and the rank layout."""
        if self.name == "local":
            return f"one process in SLURM job {self.job_id}" if self.job_id else "one process"
        who = f"SLURM job {self.job_id}" if self.name == "slurm" and self.job_id else self.launcher
        text = f"{who}, rank {self.rank} of {self.world_size} (local {self.local_rank})"
        if self.num_nodes is not None:
            text += f" on {self.num_nodes} node" + ("s" if self.num_nodes != 1 else "")
        return text

    def torch_env(self) -> dict[str, str]:
        """The variables ``torch.distributed``'s ``env://`` and accelerate read, with this job's values.

        Export them before accelerate builds its state, and a job that SLURM or MPI started
        forms its process group as one that torchrun started. Empty for ``"local"``.
        """
        if self.name == "local":
            return {}
        env = {
            "RANK": str(self.rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "MASTER_ADDR": self.master_addr,
            "MASTER_PORT": str(self.master_port),
        }
        if self.local_world_size is not None:
            env["LOCAL_WORLD_SIZE"] = str(self.local_world_size)
        return env


ONE_PROCESS = ClusterEnvironment(name="local")  # no launcher: this process runs alone


class EnvironmentReader:
    """The environment variables (a mapping), with integer parsing that names the variable when a value is not a number."""

    def __init__(self, environ: Mapping[str, str]):
        self.environ = environ

    def __contains__(self, name: str) -> bool:
        return name in self.environ

    def get(self, name: str) -> Optional[str]:
        value = self.environ.get(name)
        return None if value is None or value.strip() == "" else value.strip()

    def first(self, *names: str) -> Optional[str]:
        """The name of the first of ``names`` that is set."""
        return next((name for name in names if self.get(name) is not None), None)

    def integer(self, name: str, default: Optional[int] = None) -> Optional[int]:
        value = self.get(name)
        if value is None:
            return default
        try:
            return int(value)
        except ValueError:
            raise ClusterEnvironmentError(
                f"{name}={value!r} is not a whole number. {name} is read to place this process in its job; "
                f"unset it or give it a whole number."
            ) from None

    def required_int(self, name: str, launcher: str, fix: str) -> int:
        value = self.integer(name)
        if value is None:
            raise ClusterEnvironmentError(f"{launcher} started this process, but {name} is not set. {fix}")
        return value


def env_port(env: EnvironmentReader) -> int:
    """MASTER_PORT, else torchrun's default port."""
    port = env.integer("MASTER_PORT")
    return DEFAULT_PORT if port is None else port


__all__ = [
    "DEFAULT_PORT",
    "ONE_PROCESS",
    "ClusterEnvironment",
    "ClusterEnvironmentError",
    "EnvironmentReader",
    "env_port",
]
