"""sparse_asr.figures.save_png: the picture matplotlib drew, in a palette PNG that is smaller."""
import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pytest
from PIL import Image

from sparse_asr.figures import save_png

pytestmark = pytest.mark.unit


def busy_figure():
    """What compare_runs draws at its busiest: many curves, shaded bands, a log axis, a legend."""
    rng = np.random.default_rng(0)
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    x = np.arange(1, 300)
    for i in range(17):
        y = 100 * np.exp(-x / (50 + 5 * i)) + rng.normal(0, 1, x.size) + 5
        axes[0].plot(x, y, label=f"run {i}", linewidth=1.2)
        axes[1].fill_between(x, y * 0.9, y * 1.1, alpha=0.2)
        axes[1].plot(x, y, linewidth=0.8)
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    return fig


def test_the_palette_png_is_the_same_picture_in_fewer_bytes(tmp_path):
    fig = busy_figure()
    plain = io.BytesIO()
    fig.savefig(plain, format="png", dpi=110)
    path = tmp_path / "curves.png"
    save_png(fig, path, dpi=110)
    plt.close(fig)
    saved, reference = Image.open(path), Image.open(io.BytesIO(plain.getvalue()))
    assert saved.mode == "P" and saved.size == reference.size
    diff = np.abs(np.asarray(saved.convert("RGB"), dtype=np.int16)
                  - np.asarray(reference.convert("RGB"), dtype=np.int16))
    assert diff.mean() < 1.5 and np.mean(diff.max(axis=2) > 32) < 0.005, (diff.mean(), np.mean(diff.max(axis=2) > 32))
    assert path.stat().st_size < 0.7 * len(plain.getvalue()), (path.stat().st_size, len(plain.getvalue()))
    assert [p.name for p in tmp_path.iterdir()] == ["curves.png"]  # written atomically: no temporary file left


def test_the_committed_pictures_are_palette_pngs():
    """The checkout travels to a lent GPU machine beside the offline bundle under a size limit
    (tests/test_offline_bundle.py): a picture committed as full-colour RGBA costs about 2.5x its palette form."""
    import subprocess
    from pathlib import Path
    repo = Path(__file__).resolve().parent.parent
    tracked = subprocess.run(["git", "ls-files", "*.png"], cwd=repo, capture_output=True, text=True, check=True)
    pictures = tracked.stdout.split()
    assert pictures
    modes = {name: Image.open(repo / name).mode for name in pictures}
    assert {name: mode for name, mode in modes.items() if mode != "P"} == {}
