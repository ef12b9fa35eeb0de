"""DGC's warm-up (Lin et al. 2018, section 3.3) as a wrapper: the density falls exponentially over the first
epochs to the configured one (compression.density_warmup_epochs), so the memory does not hold back almost the
whole gradient while the model changes fastest."""
from __future__ import annotations

from sparse_asr.compression.base import Compressor, CompressorWrapper


def warmup_density(density: float, warmup_epochs: int, epoch: int) -> float:
    """The density in epoch `epoch` (0-based): c, c^2, ..., c^E over the first E = `warmup_epochs` epochs with
    c = density^(1/(E+1)), then `density` (E = 4, density 0.001: 25%, 6.25%, 1.56%, 0.4%, then 0.1%, the paper's)."""
    if epoch >= warmup_epochs:
        return density
    return max(density ** ((epoch + 1) / (warmup_epochs + 1)), density)


class DensityWarmup(CompressorWrapper):
    """`inner` at warmup_density(its configured density, epochs, epoch) in each epoch. Stateless: the epoch, which
    the trainer's progress carries, decides the density, so a resumed run continues the same schedule."""

    def __init__(self, inner: Compressor, epochs: int):
        super().__init__(inner)
        self.target, self.epochs = inner.density, epochs

    def describe(self) -> str:
        return f"{self.inner.describe()}, its density reached over {self.epochs} warm-up epochs"

    def start_epoch(self, epoch: int) -> None:
        self.set_density(warmup_density(self.target, self.epochs, epoch))
        self.inner.start_epoch(epoch)
