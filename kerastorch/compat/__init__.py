"""torchkeras in one room: everything kerastorch does so that a torchkeras program runs with only
its import changed.

| module | what |
| --- | --- |
| ``runners`` | ``KerasModel.StepRunner = MyStepRunner`` (and ``EpochRunner``) run inside fit's loop, as one more ``Epochs`` |
| ``module`` | ``KerasModel``'s ``nn.Module`` names (``model(x)``, ``model.parameters()``, ``fit_ddp`` ...) |
| ``accelerator`` | ``model.accelerator`` outside fit, and the one a program's runner sees |
| ``callbacks`` | torchkeras-style callbacks (``on_fit_start(model)`` ...) run as kerastorch callbacks |
| ``kerascallbacks`` | torchkeras's callbacks by name (``from kerastorch.kerascallbacks import ...``) |
| ``metrics`` | torchkeras's metrics by name (``from kerastorch.metrics import ...``) |
| ``arguments`` | torchkeras's words for fit's options (``quiet``, ``mixed_precision``, ``cpu``) |

Nothing outside this folder knows torchkeras, except the re-exports that keep its import paths
(``kerastorch.kerascallbacks``, ``kerastorch.metrics``, ``kerastorch.summary``).
"""
