"""What pytest collects from the repository: the tests, and the doctests of the package.

The scripts in tests/ that tests start as subprocesses train when imported, so they are
not collected; the module that needs Lightning is left out where Lightning is not installed.
"""

import importlib.util

collect_ignore_glob = ["tests/*_script.py"]
collect_ignore = [] if importlib.util.find_spec("lightning") else ["kerastorch/lightmodel.py"]
