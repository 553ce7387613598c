"""What is checked before the first weight changes, beyond the keywords (which the door,
:mod:`kerastorch.arguments`, checks): the model (:mod:`~kerastorch.checks.model`) and the first
batch through the net, the loss and the metrics (:mod:`~kerastorch.checks.first_batch`)."""
