"""The tutorials run top to bottom in a real Jupyter kernel, and show plots and progress widgets.

Each notebook is executed on a copy (the committed one, with its outputs, is left alone)
by ``notebooks/run_notebooks.py``, in a ``python3`` kernel whose PYTHONPATH starts with
this repository.
"""

import importlib.util
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("ipywidgets", reason="the progress widgets need ipywidgets (pip install kerastorch[test])")

pytestmark = pytest.mark.slow  # each notebook runs in a fresh Jupyter kernel
from nbclient.exceptions import CellExecutionError  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"
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


def outputs_of(cell) -> list:
    return cell.get("outputs", []) if cell.cell_type == "code" else []


def mime_types(cell) -> list[str]:
    return [mime for output in outputs_of(cell) for mime in output.get("data", {})]


def progress_bars(notebook) -> list[dict]:
    """The final state of every progress bar widget saved in the notebook."""
    state = notebook.metadata.get("widgets", {}).get(WIDGET_STATE, {}).get("state", {})
    return [model["state"] for model in state.values() if model["model_name"] == "FloatProgressModel"]


def code_cells_with(notebook, text: str) -> list:
    return [cell for cell in notebook.cells if cell.cell_type == "code" and text in cell.source]


def test_the_tutorials_are_there():
    assert [p.name[:3] for p in NOTEBOOKS] == ["01_", "02_", "03_", "04_", "05_", "06_"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs_in_a_kernel_without_errors(path, executed):
    notebook = executed(path)
    errors = [output for cell in notebook.cells for output in outputs_of(cell) if output.output_type == "error"]
    assert not errors
    # Every fit that shows progress bars shows them as widgets, and all of them finished in green
    # (an early stop is a finished run, not a failed one). fit(devices=2) included: its main
    # process, forked from the kernel, draws them in the cell.
    for cell in code_cells_with(notebook, ".fit("):
        if "verbose=" not in cell.source and "gpu" not in cell.source:
            assert WIDGET_VIEW in mime_types(cell), cell.source
    assert all(bar["bar_style"] == "success" for bar in progress_bars(notebook))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_notebook_has_its_outputs_and_stays_small(path):
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    code_cells = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code_cells and all(cell.execution_count is not None for cell in code_cells), "run notebooks/run_notebooks.py"
    assert [cell.execution_count for cell in code_cells] == list(range(1, len(code_cells) + 1)), "ran out of order"
    assert path.stat().st_size < MAX_NOTEBOOK_BYTES


def test_quick_start_draws_one_live_plot_and_two_reused_bars(executed):
    notebook = executed(NOTEBOOKS[0])
    (fit_cell,) = code_cells_with(notebook, "plot=True")
    kinds = mime_types(fit_cell)
    # One image, updated in place each epoch, not one image per epoch.
    assert kinds.count("image/png") == 1
    # An epoch bar and a step bar that is reset each epoch, not one new bar per epoch.
    assert kinds.count(WIDGET_VIEW) == 2
    (history_cell,) = [cell for cell in notebook.cells if cell.cell_type == "code" and cell.source == "dfhistory"]
    epochs_run = len(history_cell.outputs[0]["data"]["text/plain"].splitlines()) - 1  # the header, then a row per epoch
    bars = progress_bars(notebook)
    assert sorted((bar["value"], bar["max"]) for bar in bars) == sorted([(epochs_run, epochs_run), (22, 22)])
    # The static plots render as images too: pandas' plot and kt.plot_history.
    for source in ("dfhistory.plot(", "kt.plot_history("):
        (cell,) = code_cells_with(notebook, source)
        assert "image/png" in mime_types(cell)


def test_callbacks_tutorial_writes_its_files_in_a_fresh_folder_so_it_can_run_twice():
    # A state file left by an earlier Run All in the same folder would make the resume=True
    # section resume instead of showing the stop; a fresh folder per run keeps the story the same.
    notebook = nbformat.read(next(p for p in NOTEBOOKS if p.name.startswith("04_")), as_version=4)
    first_code = next(cell for cell in notebook.cells if cell.cell_type == "code")
    assert "os.chdir(tempfile.mkdtemp(" in first_code.source
    writes_files = [cell for cell in notebook.cells if cell.cell_type == "code" and "ckpt_path=" in cell.source]
    assert writes_files and notebook.cells.index(first_code) < notebook.cells.index(writes_files[0])
