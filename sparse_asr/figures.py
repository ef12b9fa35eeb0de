"""The one way this project saves a figure: a PNG with a 256-colour palette, written atomically.

A plot of lines and shaded bands needs far fewer than 256 colours to look the same, and a palette PNG takes a
third to a half of the bytes of matplotlib's RGBA one. That matters because figures are committed beside the
runs they show, and the checkout travels to GPU nodes with the offline bundle under a size limit
(tests/test_offline_bundle.py)."""
from __future__ import annotations

import io
from pathlib import Path

from PIL import Image

from sparse_asr.fileio import atomic_write


def save_png(fig, path: str | Path, dpi: int = 110) -> None:
    """Save the matplotlib figure `fig` at `path` as a palette PNG."""
    rendered = io.BytesIO()
    fig.savefig(rendered, format="png", dpi=dpi)
    rendered.seek(0)
    image = Image.open(rendered).convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    atomic_write(path, lambda f: image.save(f, format="PNG", optimize=True))
