"""Metrics on a causal language model get its logits and labels unshifted: the Hugging Face page says
so, and its two fixes, run here as a reader pastes them, give the perplexity ``exp(val_loss)``."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTION = "## Metrics on a causal language model"


def run_like_a_notebook(blocks: list[str]) -> tuple[list, dict]:
    """Each block after the ones above it, in one namespace; what each block's last expression shows."""
    namespace: dict = {"__name__": "huggingface_page"}
    shown = []
    for number, code in enumerate(blocks, 1):
        tree = ast.parse(code)
        last = tree.body[-1] if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        body = tree.body[:-1] if last is not None else tree.body
        where = f"docs/huggingface.md, block {number} of the section"
        exec(compile(ast.Module(body, type_ignores=[]), where, "exec"), namespace)
        shown.append(None if last is None else eval(compile(ast.Expression(last.value), where, "eval"), namespace))
    return shown, namespace


@pytest.mark.slow
def test_the_pages_two_fixes_give_the_perplexity_exp_val_loss_where_the_unshifted_metric_does_not():
    pytest.importorskip("transformers")
    page = (ROOT / "docs" / "huggingface.md").read_text()
    section = page.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = [block.split("```", 1)[0] for block in section.split("```python\n")[1:]]
    assert len(blocks) == 3
    (unshifted, _, shifted), namespace = run_like_a_notebook(blocks)
    exp_loss = unshifted["exp_val_loss"].iloc[-1]
    assert unshifted["val_ppl"].iloc[-1] > 2 * exp_loss  # the metric scored each token against itself
    from_loss = namespace["history"]  # the first fix: perplexity from val_loss
    assert from_loss["val_ppl"].tolist() == pytest.approx([math.exp(v) for v in from_loss["val_loss"]])
    assert shifted["val_ppl"].tolist() == pytest.approx(shifted["exp_val_loss"].tolist(), rel=1e-5)  # the second
