"""Stand-ins for what torchkeras's ``examples/CRNN_CTC.ipynb`` imports but kerastorch does not
install: the ``captcha`` package's ``ImageCaptcha`` and torchvision's ``to_tensor`` and
``to_pil_image``, with the same calls and the same kinds of results (PIL images; float tensors
``[3, H, W]`` in ``[0, 1]``).

``ImageCaptcha.generate_image(text)`` draws each character as a glyph of its own: a fixed random
pattern (the same for every generator of the same size), one per slot from left to right, plus
noise. Not a font, but each character looks the same wherever it appears, so a CRNN can learn to
read the string.
"""

from __future__ import annotations

import random
from functools import cache

import numpy as np
import torch
from PIL import Image

GLYPH_CHARACTERS = "-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@cache
def glyphs(height: int, slot_width: int) -> dict[str, np.ndarray]:
    """One fixed pattern per character, ``[height, slot_width, 3]`` in ``[0, 1]``: coarse blocks
    (8 x 6), so that they survive the convolutions and poolings, and different for each character."""
    rng = np.random.default_rng(0)
    patterns = {}
    for ch in GLYPH_CHARACTERS:
        blocks = rng.random((8, 6, 3))
        pattern = blocks.repeat(-(-height // 8), axis=0).repeat(-(-slot_width // 6), axis=1)
        patterns[ch] = pattern[:height, :slot_width]
    return patterns


class ImageCaptcha:
    """``captcha.image.ImageCaptcha(width, height)``: ``generate_image(text)`` gives an RGB image of
    ``width x height``. The noise is drawn from a generator seeded from ``random`` (which the program
    seeds), so a run is repeatable. Other arguments of captcha's (``fonts``, ``font_sizes``) are
    accepted and unused."""

    def __init__(self, width: int = 160, height: int = 60, fonts=None, font_sizes=None):
        self.width, self.height = width, height
        self.rng = np.random.default_rng(random.getrandbits(32))

    def generate_image(self, chars: str) -> Image.Image:
        slot = self.width // len(chars)
        patterns = glyphs(self.height, slot)
        image = np.zeros((self.height, self.width, 3))
        for i, ch in enumerate(chars):
            image[:, i * slot : (i + 1) * slot] = patterns[ch]
        image += self.rng.normal(0.0, 0.1, image.shape)
        return Image.fromarray((image.clip(0, 1) * 255).round().astype(np.uint8))


def to_tensor(pic: Image.Image) -> torch.Tensor:
    """torchvision's ``to_tensor`` for an RGB PIL image: float32 ``[3, H, W]`` in ``[0, 1]``."""
    array = np.asarray(pic, dtype=np.float32) / 255.0
    return torch.from_numpy(array).permute(2, 0, 1).contiguous()


def to_pil_image(pic: torch.Tensor) -> Image.Image:
    """torchvision's ``to_pil_image`` for a float tensor ``[3, H, W]`` in ``[0, 1]``."""
    array = (pic.detach().cpu().clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()
    return Image.fromarray(array)
