"""The tutorials run top to bottom in a real Jupyter kernel, and show plots and their progress.

Each notebook is executed on a copy (the committed one, with its outputs, is left alone)
by ``notebooks/run_notebooks.py``, in a ``python3`` kernel whose PYTHONPATH starts with
this repository.
"""

import importlib.util
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

pytestmark = pytest.mark.slow  # each notebook runs in a fresh Jupyter kernel
from nbclient.exceptions import CellExecutionError  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
MAX_NOTEBOOK_BYTES = 1024 * 1024


def _load_runner():
    spec = importlib.util.spec_from_file_location("run_notebooks", REPO_ROOT / "notebooks" / "run_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


runner = _load_runner()
NOTEBOOKS = runner.tutorial_notebooks()


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Executes each notebook at most once per test run; returns the executed copy."""
    done: dict = {}

    def run(path: Path):
        if path.name not in done:
            destination = tmp_path_factory.mktemp("executed") / path.name
            try:
                done[path.name] = runner.execute_notebook(path, destination, timeout=300)
            except CellExecutionError as error:
                done[path.name] = error
        if isinstance(done[path.name], CellExecutionError):
            raise done[path.name]
        return done[path.name]

    return run


def code_cells_with_tag(notebook, tag: str) -> list:
    return [cell for cell in notebook.cells if cell.cell_type == "code" and tag in cell.metadata.get("tags", [])]


def outputs_of(cell) -> list:
    return cell.get("outputs", []) if cell.cell_type == "code" else []


def mime_types(cell) -> list[str]:
    return [mime for output in outputs_of(cell) for mime in output.get("data", {})]


def progress_outputs(cell) -> list[dict]:
    """fit's progress: display outputs whose HTML holds a ``<progress>`` bar (and the same as text)."""
    return [
        output
        for output in outputs_of(cell)
        if output.output_type == "display_data" and "<progress" in output.get("data", {}).get("text/html", "")
    ]


def printed(cell, stream: str) -> str:
    return "".join(o.get("text", "") for o in outputs_of(cell) if o.output_type == "stream" and o.name == stream)


def code_cells_with(notebook, text: str) -> list:
    return [cell for cell in notebook.cells if cell.cell_type == "code" and text in cell.source]


def test_the_tutorials_are_there():
    assert [p.name[:3] for p in NOTEBOOKS] == ["01_", "02_", "03_", "04_", "05_", "06_"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_a_kernel_without_errors(path, executed):
    notebook = executed(path)
    errors = [output for cell in notebook.cells for output in outputs_of(cell) if output.output_type == "error"]
    # A cell tagged raises-exception shows an error on purpose (a preempted fit): one line, no traceback.
    shown = [o for o in errors if o.ename == "Preempted" and len(o.traceback) == 1]
    assert len(shown) == len(code_cells_with_tag(notebook, "raises-exception"))
    assert not [o for o in errors if o not in shown]
    # Every fit that shows progress shows it as one output updated in place (no widgets: it
    # renders in every front end), ending on its last epoch's full bar. fit(devices=2) included:
    # its main process, forked from the kernel, draws it in the cell.
    for cell in code_cells_with(notebook, ".fit("):
        if "verbose=" not in cell.source and "gpu" not in cell.source:
            (progress,) = progress_outputs(cell)
            last = progress["data"]["text/plain"].splitlines()[-1]
            done, total = last.split("] ")[1].split()[0].split("/")
            assert done == total, last
    # No warning from the progress (tqdm's "IProgress not found", widget comm errors).
    for cell in notebook.cells:
        assert "IProgress" not in printed(cell, "stderr") and "TqdmWarning" not in printed(cell, "stderr")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebook_has_its_outputs_and_stays_small(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code_cells and all(cell.execution_count is not None for cell in code_cells), "run notebooks/run_notebooks.py"
    assert [cell.execution_count for cell in code_cells] == list(range(1, len(code_cells) + 1)), "ran out of order"
    assert path.stat().st_size < MAX_NOTEBOOK_BYTES


def test_quick_start_draws_one_live_plot_and_one_progress_with_every_epoch_readable(executed):
    notebook = executed(NOTEBOOKS[0])
    (fit_cell,) = code_cells_with(notebook, "plot=True")
    # One image, updated in place each epoch, not one image per epoch; one progress output,
    # updated in place: a bounded number of outputs however many redraws there were.
    assert mime_types(fit_cell).count("image/png") == 1
    (progress,) = progress_outputs(fit_cell)
    assert len(outputs_of(fit_cell)) <= 5
    (history_cell,) = [cell for cell in notebook.cells if cell.cell_type == "code" and cell.source == "history"]
    table = history_cell.outputs[0]["data"]["text/plain"].splitlines()
    header, rows = table[0].split(), [line.split() for line in table[1:]]
    text = progress["data"]["text/plain"]
    # Each epoch's line holds every value in full, the monitored val_acc marked when it improved.
    for row in rows:
        values = dict(zip(header, row[1:]))
        (line,) = [line for line in text.splitlines() if line.startswith(f"Epoch {values['epoch']}/10 (")]
        shown = dict(item.split("=") for item in line.split(": ", 1)[1].replace(" ★ best", "").split(", "))
        for name in ("train_loss", "train_acc", "val_loss", "val_acc"):
            assert float(shown[name]) == pytest.approx(float(values[name]), rel=1e-3), (name, line)
    assert "val_acc=" in text and "★ best" in text
    assert "<progress" in progress["data"]["text/html"]
    # The last line names the weights the net ends with.
    assert "Restored the weights of epoch" in printed(fit_cell, "stdout")
    # The static plots render as images too: pandas' plot and kt.plot_history.
    for source in ("history.plot(", "kt.plot_history("):
        (cell,) = code_cells_with(notebook, source)
        assert "image/png" in mime_types(cell)


def test_quick_start_trains_as_the_readme_does_and_scores_the_test_digits_once():
    readme = (REPO_ROOT / "README.md").read_text()
    first_fit = readme.split("```python\n", 1)[1].split("```", 1)[0]
    notebook = nbformat.read(NOTEBOOKS[0], as_version=4)
    code = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    model_lines = first_fit[first_fit.index("model = kt.KerasModel(") :]
    for line in model_lines.splitlines() + first_fit.splitlines()[:6]:  # the imports, the seed, the model, fit
        if line.strip():
            assert line in code, f"notebook 01 does not share the README's line {line!r}"
    assert "dl_train, dl_val, dl_test = digits_loaders()" in code
    scored = [cell for cell in notebook.cells if cell.cell_type == "code" and "(dl_test)" in cell.source]
    fit_cell = next(cell for cell in notebook.cells if cell.cell_type == "code" and ".fit(dl_train" in cell.source)
    assert len(scored) == 1 and notebook.cells.index(scored[0]) > notebook.cells.index(fit_cell)
    assert "test accuracy on 224 digits" in printed(scored[0], "stdout")


def test_callbacks_tutorial_writes_its_files_in_a_fresh_folder_so_it_can_run_twice():
    # A state file left by an earlier Run All in the same folder would make the resume=True
    # section resume instead of showing the stop; a fresh folder per run keeps the story the same.
    notebook = nbformat.read(next(p for p in NOTEBOOKS if p.name.startswith("04_")), as_version=4)
    first_code = next(cell for cell in notebook.cells if cell.cell_type == "code")
    assert "os.chdir(tempfile.mkdtemp(" in first_code.source
    writes_files = [cell for cell in notebook.cells if cell.cell_type == "code" and "ckpt_path=" in cell.source]
    assert writes_files and notebook.cells.index(first_code) < notebook.cells.index(writes_files[0])


def test_kerastorch_itself_gives_no_iprogress_warning_in_a_kernel_without_ipywidgets():
    # The test environment has ipywidgets (with transformers installed, torchmetrics imports
    # huggingface_hub, whose tqdm.auto warns in a kernel without it: not kerastorch's doing).
    # Here the kernel cannot import ipywidgets, and kerastorch, imported first, must stay quiet.
    cells = [
        "import sys\nsys.modules['ipywidgets'] = None  # as in a kernel without ipywidgets",
        "import kerastorch as kt\nimport torch\nfrom torch import nn",
        "net = nn.Linear(4, 2)\nX, y = torch.randn(64, 4), torch.randint(0, 2, (64,))\n"
        "model = kt.KerasModel(net, nn.CrossEntropyLoss())\nmodel.fit(X, y, epochs=2)\nmodel.predict(X).shape",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source) for source in cells])
    nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
    stderr = "".join(printed(cell, "stderr") for cell in notebook.cells)
    assert "IProgress" not in stderr and "TqdmWarning" not in stderr
    assert "Epoch 2/2" in "".join(str(output) for cell in notebook.cells for output in outputs_of(cell))


def test_the_doctor_tutorial_shows_one_report_of_what_the_curves_say(executed):
    notebook = executed(NOTEBOOKS[5])
    # The healthy fit prints nothing more; the slow one prints its report at its end.
    said = [cell for cell in notebook.cells if "What the curves say:" in printed(cell, "stdout")]
    (slow_fit,) = code_cells_with(notebook, "slow_model.fit(")
    assert said == [slow_fit]
    assert "[info] not_converged: Still improving at the last epoch: epoch 8" in printed(slow_fit, "stdout")
    # model.diagnose() shows the same report as a table.
    (shown,) = code_cells_with(notebook, "slow_model.diagnose()")
    html = shown.outputs[0]["data"]["text/html"]
    assert "<caption>What the curves say:</caption>" in html and "<code>not_converged</code>" in html
