"""Which torchkeras names do real programs use, and which of them does kerastorch have?

Reads every notebook (``.ipynb``) and script (``.py``) under the folders given — local
checkouts of lyhue1991/torchkeras and lyhue1991/eat_pytorch_in_20_days, say — and counts
the torchkeras names they use: ``torchkeras.X`` (and ``torchkeras.x.Y``), the names in
``from torchkeras[.x] import ...``, and the attributes and keyword arguments they use on a
``KerasModel`` (``model.fit(..., ckpt_path=...)``, ``model.history``), and the class
attributes they replace (``KerasModel.StepRunner = ...``). Then it says, for each, whether
``import kerastorch as torchkeras`` has it.

    python benchmarks/torchkeras_census.py path/to/torchkeras path/to/eat_pytorch_in_20_days
"""

from __future__ import annotations

import argparse
import collections
import importlib
import inspect
import json
import re
from pathlib import Path

import kerastorch

NAME = r"[A-Za-z_][A-Za-z0-9_]*"
ATTRIBUTE = re.compile(rf"\btorchkeras((?:\.{NAME})+)")
FROM_IMPORT = re.compile(rf"from\s+torchkeras((?:\.{NAME})*)\s+import\s+\(?([^\n)]+)")
KERAS_MODEL_CALL = re.compile(rf"\bmodel\.({NAME})\b(\()?")
CLASS_ASSIGNMENT = re.compile(rf"\bKerasModel\.({NAME})\s*=(?!=)")
KEYWORD = re.compile(rf"\b({NAME})\s*=(?!=)")


def source_of(path: Path) -> str:
    """A notebook's code cells, or a script's text."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix != ".ipynb":
        return text
    try:
        cells = json.loads(text).get("cells", [])
    except json.JSONDecodeError:
        return ""
    return "\n".join("".join(c.get("source", [])) for c in cells if c.get("cell_type") == "code")


def calls_of(code: str, method: str) -> list[str]:
    """The text inside each ``model.<method>(...)`` call (parentheses balanced)."""
    found = []
    for match in re.finditer(rf"\bmodel\.{method}\(", code):
        depth, start = 1, match.end()
        for i in range(start, len(code)):
            depth += {"(": 1, ")": -1}.get(code[i], 0)
            if depth == 0:
                found.append(code[start:i])
                break
    return found


def census(folders: list[Path]) -> dict[str, collections.Counter]:
    names: collections.Counter = collections.Counter()
    model_attributes: collections.Counter = collections.Counter()
    fit_keywords: collections.Counter = collections.Counter()
    class_assignments: collections.Counter = collections.Counter()
    for folder in folders:
        for path in sorted([*folder.rglob("*.ipynb"), *folder.rglob("*.py")]):
            code = source_of(path)
            if "torchkeras" not in code:
                continue
            for match in ATTRIBUTE.finditer(code):
                names["torchkeras" + match.group(1)] += 1
            for module, imported in FROM_IMPORT.findall(code):
                for name in imported.split(","):
                    name = name.strip().split(" as ")[0].strip()
                    if re.fullmatch(NAME, name):
                        names[f"torchkeras{module}.{name}"] += 1
            for attribute, _ in KERAS_MODEL_CALL.findall(code):
                model_attributes[attribute] += 1
            class_assignments.update(CLASS_ASSIGNMENT.findall(code))
            for call in calls_of(code, "fit"):
                fit_keywords.update(KEYWORD.findall(call))
    return {
        "names": names,
        "model attributes": model_attributes,
        "fit keywords": fit_keywords,
        "KerasModel assignments": class_assignments,
    }


def kerastorch_has(dotted: str) -> bool:
    """Whether ``import kerastorch as torchkeras`` resolves ``torchkeras.a.b`` (as an attribute
    or through ``from torchkeras.a import b``)."""
    parts = dotted.split(".")[1:]
    for split in range(len(parts), -1, -1):  # the longest importable module first
        try:
            obj: object = importlib.import_module(".".join(["kerastorch", *parts[:split]]))
        except ImportError:
            continue
        for part in parts[split:]:
            if not hasattr(obj, part):
                break
            obj = getattr(obj, part)
        else:
            return True
    return False


def keras_model_attributes() -> set[str]:
    """What a KerasModel answers to, including what ``__init__`` and ``fit`` set on the instance
    (``net``, ``history``, ``ckpt_path``, ``run_id``...), not only its class's methods."""
    import torch

    net = torch.nn.Linear(2, 1)
    model = kerastorch.KerasModel(net, torch.nn.MSELoss(), optimizer=torch.optim.SGD(net.parameters(), lr=0.1))
    model.fit((torch.zeros(4, 2), torch.zeros(4, 1)), epochs=1, verbose=0)
    return set(dir(model)) | set(vars(model))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folders", nargs="+", type=Path)
    args = parser.parse_args(argv)
    found = census(args.folders)
    fit_parameters = set(inspect.signature(kerastorch.KerasModel.fit).parameters)
    answered = keras_model_attributes()
    print("torchkeras names (uses): in kerastorch?")
    for name, count in found["names"].most_common():
        print(f"  {name:<50} {count:4d}  {'yes' if kerastorch_has(name) else 'NO'}")
    print("model.<attribute> (uses): on KerasModel?")
    for name, count in found["model attributes"].most_common():
        print(f"  {name:<50} {count:4d}  {'yes' if name in answered else 'no (or not a KerasModel)'}")
    print("fit keywords (uses): accepted by fit?")
    for name, count in found["fit keywords"].most_common():
        print(f"  {name:<50} {count:4d}  {'yes' if name in fit_parameters else 'NO'}")
    # torchkeras's way to change the step (KerasModel.StepRunner = ...) replaces a class attribute;
    # kerastorch's KerasModel has StepRunner and EpochRunner for that, and fit runs what is assigned.
    print("KerasModel.<attribute> = ... (uses): an attribute KerasModel has?")
    for name, count in found["KerasModel assignments"].most_common():
        print(f"  {name:<50} {count:4d}  {'yes' if hasattr(kerastorch.KerasModel, name) else 'NO'}")


if __name__ == "__main__":
    main()
