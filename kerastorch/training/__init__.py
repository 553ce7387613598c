"""Training's parts, below the run (:mod:`kerastorch.run`): the epoch loop and the optimizer step
(:mod:`~kerastorch.training.loop`), the loops of evaluate and predict (:mod:`~kerastorch.training.eval_loop`),
a batch that runs out of memory done again as micro-batches (:mod:`~kerastorch.training.out_of_memory`),
the epoch values (:mod:`~kerastorch.training.meters`, one meter per metric in
:mod:`~kerastorch.training.metric_meters`, synced over processes by :mod:`~kerastorch.training.metric_sync`),
the scheduler's calls (:mod:`~kerastorch.training.schedulers`), what a net's output holds
(:mod:`~kerastorch.training.outputs`) and the labels as a loss needs them (:mod:`~kerastorch.training.labels`),
the history's frame (:mod:`~kerastorch.training.history`), ``torch.compile`` for a run
(:mod:`~kerastorch.training.compiling`), where a run is inside an epoch
(:mod:`~kerastorch.training.position`), SIGTERM and SIGUSR1 turned into a clean stop
(:mod:`~kerastorch.training.preemption`), the first batches' checks
(:mod:`~kerastorch.training.first_batch`) and the ``Callback`` base with its list
(:mod:`~kerastorch.training.callback`, :mod:`~kerastorch.training.callback_list`)."""
