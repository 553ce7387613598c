"""The quick-start tutorial as a person sees it: a real JupyterLab in a real (headless) Chromium.

JupyterLab runs on 127.0.0.1 in a fresh folder with a copy of notebook 01, Chromium
(driven by selenium) opens it at 1280 px and runs all cells, and the page is read: no
error, the monitored ``val_acc`` of the finished epochs visible as text during ``fit`` and
after it, exactly one plot image in the fit cell's output, the progress complete. Then
again with the ipywidgets front-end extension disabled, as in a JupyterLab, VS Code or
Colab without it. Screenshots go to the test's temporary folder, for a person to look at.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = next((REPO_ROOT / "notebooks").glob("01_*.ipynb"))
WIDGETS_EXTENSION = "@jupyter-widgets/jupyterlab-manager"


def chromium_and_driver() -> tuple[str, str]:
    """Chromium and its driver, installed from Debian's packages when they are missing."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    driver = shutil.which("chromedriver")
    if (browser is None or driver is None) and shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0:
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        install = ["apt-get", "install", "-y", "-q", "chromium", "chromium-driver"]
        if subprocess.run(install, capture_output=True, timeout=600, env=env).returncode != 0:
            # A fresh machine may have no package lists yet.
            subprocess.run(["apt-get", "update", "-q"], capture_output=True, timeout=600, env=env)
            subprocess.run(install, capture_output=True, timeout=600, env=env)
        browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.skip(
            "Chromium and chromedriver are not installed and could not be installed (apt-get install chromium chromium-driver)"
        )
    return browser, driver


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class JupyterLab:
    """A JupyterLab server in its own process group, stopped with everything it started."""

    def __init__(self, root: Path, config_dir: Path, token: str = "kerastorch-browser-test"):
        self.port, self.token = free_port(), token
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p),
            "JUPYTER_CONFIG_DIR": str(config_dir),
            "OMP_NUM_THREADS": "1",
        }
        command = [
            sys.executable,
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={root}",
            "--LabApp.expose_app_in_browser=True",
            "--ServerApp.allow_root=True",  # CI machines run tests as root
        ]
        self.log = open(root.parent / f"jupyterlab-{self.port}.log", "w")
        self.process = subprocess.Popen(
            command, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{self.url('api/status')}", timeout=2) as response:
                    json.load(response)
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"JupyterLab did not start; see {self.log.name}") from None
                time.sleep(0.5)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}/{path}?token={self.token}"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)  # the server and its kernels
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.log.close()


NOTEBOOK_JS = "const nb = window.jupyterapp.shell.currentWidget.content;"


def show_fit_cell(driver) -> None:
    """Scroll the quick start's fit cell (the code cell with ``plot=True``) into view, as a person
    watching it would: JupyterLab only renders the cells in view."""
    driver.execute_script(
        NOTEBOOK_JS
        + "const i = nb.widgets.findIndex(w => w.model.type === 'code' && w.model.sharedModel.getSource().includes('plot=True'));"
        "nb.scrollToCell(nb.widgets[i], 'start');"
    )
    time.sleep(0.3)


def fit_cell_report(driver) -> dict:
    """What the page shows in the fit cell's output."""
    return driver.execute_script(
        NOTEBOOK_JS
        + """
        const i = nb.widgets.findIndex(w => w.model.type === 'code' && w.model.sharedModel.getSource().includes('plot=True'));
        const node = nb.widgets[i] && nb.widgets[i].node;
        const output = node && node.querySelector('.jp-OutputArea');
        if (!output) return {text: '', images: 0, clipped: null, bar: null};  // not rendered yet
        const pre = output.querySelector('pre');
        const bar = output.querySelector('progress');
        return {
            text: output.innerText,
            images: output.querySelectorAll('img').length,
            clipped: pre ? pre.scrollWidth > pre.clientWidth + 1 : null,
            bar: bar ? [Number(bar.getAttribute('value')), Number(bar.getAttribute('max'))] : null,
        };
        """
    )


def all_cells_ran(driver) -> bool:
    return driver.execute_script(
        NOTEBOOK_JS + "const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;"
        "return kernel.status === 'idle'"
        " && nb.widgets.every(w => w.model.type !== 'code' || w.model.executionCount !== null);"
    )


def error_outputs(driver) -> list:
    """Every error output and every warning printed, read from the notebook's outputs."""
    return driver.execute_script(
        NOTEBOOK_JS
        + """
        const found = [];
        for (const cell of nb.widgets.map(w => w.model)) {
            if (cell.type !== 'code') continue;
            for (let k = 0; k < cell.outputs.length; k++) {
                const out = cell.outputs.get(k).toJSON();
                const text = [].concat(out.text || []).join('');
                if (out.output_type === 'error' || (out.name === 'stderr' && /Warning|Error|Traceback/.test(text)))
                    found.push(out.output_type === 'error' ? out.ename + ': ' + out.evalue : text);
            }
        }
        return found;
        """
    )


def run_quick_start_in_the_browser(driver, lab: JupyterLab, shots: Path, name: str) -> dict:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ready
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get(lab.url(f"lab/tree/{NOTEBOOK.name}"))
    WebDriverWait(driver, 120).until(ready.presence_of_element_located((By.CSS_SELECTOR, ".jp-Notebook .jp-CodeCell")))
    WebDriverWait(driver, 120).until(
        lambda d: d.execute_script(
            "const p = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
            "return !!(p && p.sessionContext && p.sessionContext.session && p.sessionContext.session.kernel"
            " && p.sessionContext.session.kernel.status === 'idle');"
        )
    )
    driver.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")
    seen_during_fit = None
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not all_cells_ran(driver):
        if seen_during_fit is None:
            show_fit_cell(driver)
            report = fit_cell_report(driver)
            if "val_acc=" in report["text"] and "Restored the weights" not in report["text"]:
                seen_during_fit = report
                driver.save_screenshot(str(shots / f"{name}-during-fit.png"))
        time.sleep(0.2)
    show_fit_cell(driver)
    driver.save_screenshot(str(shots / f"{name}-after.png"))
    return {"during": seen_during_fit, "after": fit_cell_report(driver), "errors": error_outputs(driver)}


@pytest.mark.parametrize("widgets", ["with the widgets extension", "without the widgets extension"])
def test_the_quick_start_in_jupyterlab_shows_every_epoch_and_one_plot(tmp_path, widgets):
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is in the test extra")
    pytest.importorskip("jupyterlab", reason="jupyterlab is in the test extra")
    browser, driver_path = chromium_and_driver()
    root, config = tmp_path / "lab", tmp_path / "config"
    root.mkdir()
    config.mkdir()
    shutil.copy(NOTEBOOK, root / NOTEBOOK.name)
    if widgets.startswith("without"):
        env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config)}
        subprocess.run(
            # --level=user: in this test's own JUPYTER_CONFIG_DIR, never the machine's settings
            [sys.executable, "-m", "jupyter", "labextension", "disable", "--level=user", WIDGETS_EXTENSION],
            env=env,
            capture_output=True,
            check=True,
            timeout=120,
        )
        page_config = json.loads((config / "labconfig" / "page_config.json").read_text())
        assert page_config["disabledExtensions"].get(WIDGETS_EXTENSION) is True
    lab = JupyterLab(root, config)
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1000"):
        options.add_argument(argument)
    driver = None
    try:
        driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=driver_path), options=options)
        seen = run_quick_start_in_the_browser(driver, lab, tmp_path, widgets.split()[0])
    finally:
        if driver is not None:
            driver.quit()
        lab.stop()

    assert seen["errors"] == []
    during, after = seen["during"], seen["after"]
    if after is not None:  # the mark is glued to its value by no-break spaces
        after["text"] = after["text"].replace("\xa0", " ")
    assert during is not None, "no finished epoch's val_acc was visible while fit ran"
    assert after is not None and "Restored the weights of epoch" in after["text"]
    lines = [line for line in after["text"].splitlines() if line.startswith("Epoch ") and "val_acc=" in line]
    assert lines and all("train_loss=" in line and "val_loss=" in line for line in lines)
    last = lines[-1]
    value = last.split("val_acc=")[1].split()[0].rstrip(",")
    float(value)  # the last epoch's monitored value, whole
    assert "★ best" in after["text"]
    assert after["clipped"] is False  # the lines wrap; nothing is cut off at 1280 px
    assert after["images"] == 1  # the live plot: one image, replaced in place
    done, total = after["bar"]
    assert done == total > 0  # the progress shows completion
