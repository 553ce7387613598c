"""One fit run and its parts: the run (:mod:`~kerastorch.training.run`: plan, runtime, callbacks,
loop, history), the epoch loop (:mod:`~kerastorch.training.loop`), the training step
(:mod:`~kerastorch.training.step`) and the scheduler's calls (:mod:`~kerastorch.training.schedulers`),
what a net's output holds (:mod:`~kerastorch.training.outputs`: its own loss, its logits) and the labels
as a loss needs them (:mod:`~kerastorch.training.labels`), the epoch values (:mod:`~kerastorch.training.meters`, synced over
processes by :mod:`~kerastorch.training.metric_sync`), the history's frame
(:mod:`~kerastorch.training.history`), ``evaluate`` and ``predict``
(:mod:`~kerastorch.training.evaluation`), the net's train/eval mode (:mod:`~kerastorch.training.modes`),
``torch.compile`` for a run (:mod:`~kerastorch.training.compiling`), every random generator
(:mod:`~kerastorch.training.rng`), where a run is inside an epoch (:mod:`~kerastorch.training.position`),
SIGTERM and SIGUSR1 turned into a clean stop (:mod:`~kerastorch.training.preemption`), the model's parts (:mod:`~kerastorch.training.parts`) and what the
loop needs of a model (:mod:`~kerastorch.training.protocols`)."""
