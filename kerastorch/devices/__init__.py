"""Where a run trains: Lightning's words for devices and precision (:mod:`~kerastorch.devices.words`),
the machine's GPUs counted without initialising CUDA (:mod:`~kerastorch.devices.cuda`), the cluster
environment that started this process (:mod:`~kerastorch.devices.environment`, with what one is in
:mod:`~kerastorch.devices.cluster` and SLURM's variables in :mod:`~kerastorch.devices.slurm`), how
the processes of a job meet and how long they wait (:mod:`~kerastorch.devices.rendezvous`), the plan
(this process, k forked workers, or one rank of a job: :mod:`~kerastorch.devices.plan`), the k
worker processes started from a notebook (:mod:`~kerastorch.devices.launch`), the runtime the loop
talks to (:mod:`~kerastorch.devices.runtime`), the net placed on it
(:mod:`~kerastorch.devices.placement`), a file only the main process has, read there for
every process (:mod:`~kerastorch.devices.main_process`), and the CPUs and memory the process's
cgroups and affinity leave it (:mod:`~kerastorch.devices.cgroups`).

>>> import kerastorch as kt
>>> kt.devices.parse_devices("0, 2", num_available=4)
[0, 2]
"""

from .cuda import find_usable_cuda_devices
from .environment import ClusterEnvironment, cluster_environment
from .words import parse_devices

__all__ = ["ClusterEnvironment", "cluster_environment", "find_usable_cuda_devices", "parse_devices"]
