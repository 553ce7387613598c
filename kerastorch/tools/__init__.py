"""What helps around a fit, reusing its step and its snapshots: the learning-rate finder and the
one-cycle schedule (:mod:`~kerastorch.tools.tuning`), the doctor (:mod:`~kerastorch.tools.doctor`, its
checks of the data in :mod:`~kerastorch.tools.data_checks`), what a run's curves say
(:mod:`~kerastorch.tools.diagnosis`), the report types both share (:mod:`~kerastorch.tools.report`),
interpreting a classifier (:mod:`~kerastorch.tools.interpret`), the net's summary
(:mod:`~kerastorch.tools.summary`), the history's plots (:mod:`~kerastorch.helpers.plots`), a snapshot that
puts a trial's changes back (:mod:`~kerastorch.training.snapshot`) and where output goes
(:mod:`~kerastorch.helpers.notebook`)."""
