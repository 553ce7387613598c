"""The package's shape, held by tests: a dozen modules or fewer at the top, strategies as objects
that nothing else asks about, and torchkeras in one room (the door for the keywords is held by
tests/fit/test_arguments.py). Also the two ``fit_one_cycle`` bugs the restructuring fixed."""

from __future__ import annotations

import ast
import io
import json
import math
import os
import subprocess
import sys
import tokenize
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import kerastorch as kt
from helpers import called
from kerastorch import arguments

PACKAGE_DIR = Path(kt.__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent
ONE_CYCLE_SCRIPT = REPO_ROOT / "tests" / "one_cycle_script.py"


def package_modules(excluding: tuple[str, ...] = ()) -> dict[str, Path]:
    """Every module of the package by its path inside it ("training/run.py"), minus the folders named."""
    found = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        inside = path.relative_to(PACKAGE_DIR).as_posix()
        if not inside.startswith(excluding):
            found[inside] = path
    return found


# -- the shape ---------------------------------------------------------------------------------------


def test_the_top_level_holds_a_dozen_modules_or_fewer_and_each_folder_says_what_lives_there():
    top = sorted(path.name for path in PACKAGE_DIR.glob("*.py"))
    assert len(top) <= 12, top
    for init in sorted(PACKAGE_DIR.glob("*/__init__.py")):
        docstring = ast.get_docstring(ast.parse(init.read_text()))
        assert docstring and len(docstring) > 80, f"{init.parent.name}/__init__.py says nothing of what lives there"


def test_fit_s_callbacks_are_built_in_callbacks_without_the_run():
    """callbacks/ sits below the run: it builds fit's own callbacks from the settings, and the run imports them."""
    from kerastorch import run
    from kerastorch.callbacks.for_fit import callbacks_for_fit

    assert run.callbacks_for_fit is callbacks_for_fit
    imports = {
        inside: [
            ast.unparse(node) for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.ImportFrom)
        ]
        for inside, path in package_modules().items()
        if inside.startswith("callbacks/")
    }
    assert not {inside: found for inside, found in imports.items() if any("training.run" in line for line in found)}
    assert any("..settings" in line for line in imports["callbacks/for_fit.py"])


# -- strategies as objects -------------------------------------------------------------------------

# What telling strategies apart looks like: their classes, their engines' types, and their words compared.
STRATEGY_TELLS = {
    "DDP",
    "FSDP",
    "SingleDevice",
    "ModelParallel",
    "DistributedDataParallel",
    "DataParallel",
    "FSDPModule",
    "DTensor",
    "fully_shard",
    "is_model_parallel",
    "is_sharded",
}
STRATEGY_WORDS = {"ddp", "fsdp", "auto"}


def strategy_questions(source: str) -> list[str]:
    """Where ``source`` asks which strategy runs: a strategy's class or engine type named, or its
    word compared (``strategy == "fsdp"``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
        if name in STRATEGY_TELLS:
            found.append(f"line {node.lineno}: {name}")
        if isinstance(node, ast.alias) and node.name.split(".")[-1] in STRATEGY_TELLS:
            found.append(f"import of {node.name}")
        if isinstance(node, ast.Compare):
            constants = [c.value for c in (node.left, *node.comparators) if isinstance(c, ast.Constant)]
            if any(isinstance(c, str) and c.lower() in STRATEGY_WORDS for c in constants) and "strategy" in ast.unparse(
                node
            ):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_nothing_outside_strategies_asks_which_strategy_runs():
    questions = {
        inside: found
        for inside, path in package_modules(excluding=("strategies/",)).items()
        if (found := strategy_questions(path.read_text()))
    }
    assert not questions, questions


def test_a_planted_strategy_question_is_found():
    planted = "def step(net, runtime):\n    if runtime.strategy == 'fsdp':\n        return isinstance(net, DTensor)\n"
    assert sorted(strategy_questions(planted)) == ["line 2: runtime.strategy == 'fsdp'", "line 3: DTensor"]


def test_a_strategy_object_and_its_word_train_alike(tiny_data):
    X, y = tiny_data
    histories = []
    for strategy in ("ddp", kt.strategies.DDP()):
        torch.manual_seed(0)
        net = nn.Linear(4, 3)
        model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
        histories.append(model.fit(X, y, epochs=2, strategy=strategy, verbose=0)["train_loss"].tolist())
    assert histories[0] == histories[1]


def test_a_strategy_class_or_an_unknown_word_is_refused_with_what_to_pass(tiny_data):
    X, y = tiny_data
    model = kt.KerasModel(nn.Linear(4, 3), nn.CrossEntropyLoss())
    with pytest.raises(TypeError, match=r"strategy=FSDP is the class; pass an instance: strategy=FSDP\(\)"):
        model.fit(X, y, strategy=kt.strategies.FSDP, verbose=0)
    with pytest.raises(ValueError, match=r"strategy='deepspeed' is not supported.*DeepSpeed is not supported"):
        model.fit(X, y, strategy="deepspeed", verbose=0)
    with pytest.raises(TypeError, match=r"FSDP\(wrap=\.\.\.\) holds Linear\(.*which is not a module class"):
        kt.strategies.FSDP(wrap=[nn.Linear(2, 2)])


def test_fsdp_wrap_is_the_older_spelling_of_the_fsdp_object(tiny_data):
    X, y = tiny_data
    model = kt.KerasModel(nn.Sequential(nn.Linear(4, 3)), nn.CrossEntropyLoss())
    with pytest.warns(DeprecationWarning, match=r"strategy=kt.strategies.FSDP\(wrap=\[\.\.\.\]\)"):
        data, settings = arguments.fit_arguments(
            model, called(kt.KerasModel.fit, model, X, y, strategy="fsdp", fsdp_wrap=[nn.Linear])
        )
    assert settings.devices.strategy == kt.strategies.FSDP(wrap=[nn.Linear])


def test_names_that_moved_are_still_importable_from_where_they_were():
    assert kt.parse_devices is kt.devices.parse_devices
    assert kt.find_usable_cuda_devices is kt.devices.find_usable_cuda_devices
    assert kt.LivePlot is kt.callbacks.LivePlot
    from kerastorch import Diagnosis, Interpretation, LRFinderResult  # noqa: F401
    from kerastorch.callbacks import CallbackList, MonitorCallback, TorchkerasCallback  # noqa: F401

    assert "parse_devices" not in kt.__all__ and "TorchkerasCallback" not in kt.callbacks.__all__


# -- torchkeras in one room --------------------------------------------------------------------------

# The modules that keep torchkeras's import paths, and say so.
RE_EXPORTS = ("kerascallbacks.py", "metrics.py", "summary.py", "callbacks/__init__.py")


def torchkeras_mentions(source: str) -> list[str]:
    """Where ``source`` names torchkeras outside its docstrings: in code, strings or comments."""
    docstrings = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and ast.get_docstring(
            node, clean=False
        ):
            docstrings.add(node.body[0].value.lineno)  # type: ignore[attr-defined]
    found = []
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if "torchkeras" in token.string.lower() and token.start[0] not in docstrings:
            found.append(f"line {token.start[0]}: {token.string.strip()[:60]}")
    return found


def test_nothing_outside_compat_mentions_torchkeras():
    mentions = {
        inside: found
        for inside, path in package_modules(excluding=("compat/",)).items()
        if inside not in RE_EXPORTS and (found := torchkeras_mentions(path.read_text()))
    }
    assert not mentions, mentions


def test_a_planted_torchkeras_mention_is_found():
    planted = '"""torchkeras in a docstring is fine."""\n\nx = 1  # torchkeras in a comment is not\n'
    assert torchkeras_mentions(planted) == ["line 3: # torchkeras in a comment is not"]


# -- fit_one_cycle, through the door -------------------------------------------------------------------


@pytest.fixture
def tiny_data():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(96, 4)).astype("float32")
    return X, (X[:, 0] > 0).astype("int64") + (X[:, 1] > 0)


class StepRates(kt.Callback):
    """The learning rate each optimizer step uses."""

    def __init__(self):
        self.rates = []

    def on_before_optimizer_step(self, optimizer):
        self.rates.append(optimizer.param_groups[0]["lr"])


def test_fit_one_cycle_takes_keras_x_and_y(tiny_data):
    X, y = tiny_data
    torch.manual_seed(0)
    net = nn.Linear(4, 3)
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    history = model.fit_one_cycle(x=X, y=y, epochs=3, max_lr=0.5, batch_size=16, verbose=0)
    assert len(history) == 3 and history["train_loss"].iloc[-1] < history["train_loss"].iloc[0]
    assert model.lr_scheduler is None  # the cycle was this run's only


def test_fit_one_cycle_with_cpu_true_ends_the_cycle_on_the_last_step(tiny_data):
    X, y = tiny_data
    net = nn.Linear(4, 3)
    model = kt.KerasModel(net, nn.CrossEntropyLoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    rates = StepRates()
    model.fit_one_cycle(X, y, epochs=2, max_lr=0.5, batch_size=16, cpu=True, callbacks=[rates], verbose=0)
    steps = 2 * math.ceil(96 / 16)
    assert len(rates.rates) == steps
    assert rates.rates[-1] == pytest.approx(0.5 / 25 / 1e4)  # OneCycleLR's final rate: the cycle annealed
    assert max(rates.rates) == pytest.approx(0.5, rel=1e-2)


def test_lr_find_refuses_both_x_and_train_data_as_fit_does(tiny_data):
    X, y = tiny_data
    model = kt.KerasModel(nn.Linear(4, 3), nn.CrossEntropyLoss())
    with pytest.raises(ValueError, match="Both train_data and x were given"):
        model.lr_find(X, y, x=X)
    with pytest.raises(ValueError, match="Both train_data and x were given"):
        model.fit(X, y, x=X, verbose=0)


@pytest.mark.slow
def test_fit_one_cycle_under_torchrun_sizes_the_cycle_to_one_process(tmp_path):
    out = tmp_path / "rates.json"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*command, str(ONE_CYCLE_SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stdout + done.stderr
    seen = json.loads(out.read_text())
    assert seen["world_size"] == 2
    steps = 2 * math.ceil(seen["batches"] / 2)  # each process takes its half of the batches, twice
    assert len(seen["rates"]) == steps
    assert seen["rates"][-1] == pytest.approx(0.5 / 25 / 1e4)  # the cycle ends on the last step, not k times later
