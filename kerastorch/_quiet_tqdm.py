"""accelerate, imported without tqdm's "IProgress not found" warning.

accelerate imports ``tqdm.auto``, which (tqdm 4.70 and later) warns at import in a Jupyter
kernel without ipywidgets: "IProgress not found. Please update jupyter and ipywidgets".
kerastorch draws its own progress and never shows tqdm's widgets, so in a beginner's notebook
that red warning would only send them to install something they do not need. Imported first
by ``kerastorch/__init__.py``; the filter holds only while accelerate is imported.
"""

import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="IProgress not found")
    import accelerate  # noqa: F401
