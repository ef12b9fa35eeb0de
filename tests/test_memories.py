"""The memories beside error feedback: EF21-SGDM's and ScaleCom's low-pass filter against their numpy mirrors at
P = 1..4 (tests/mpi/memory_check.py), and the rules every memory that carries the momentum shares."""
import pytest

from sparse_asr.compression.memory import MEMORIES
from sparse_asr.training.config import ConfigError, load_config
from tests.mpi_helpers import check_mpi


@pytest.mark.mpi
@pytest.mark.parametrize("nprocs", [1, 2, 3, 4])
def test_memories_match_their_mirrors(nprocs):
    out = check_mpi(nprocs, ["-m", "tests.mpi.memory_check"], timeout=240)
    for what in ("topka density=0.02", "oktopk density=0.02", "cltk density=0.02", "topka density=1.0", "resume"):
        assert f"ok ef21 {what} P={nprocs}" in out, out
    assert f"ok lowpass cltk P={nprocs}" in out and f"ok lowpass oktopk P={nprocs}" in out, out


@pytest.mark.unit
@pytest.mark.parametrize("memory", [name for name, cls in MEMORIES.items() if cls.carries_momentum])
def test_a_memory_carrying_the_momentum_needs_a_selection_and_no_dense_steps(memory):
    base = [f"compression.memory={memory}", "compression.algorithm=oktopk"]
    assert load_config(None, base + ["compression.warmup_steps=0"]).compression.memory == memory
    with pytest.raises(ConfigError, match="compression.warmup_steps"):
        load_config(None, base + ["compression.warmup_steps=5"])
    with pytest.raises(ConfigError, match="needs a selection"):
        load_config(None, [f"compression.memory={memory}", "compression.algorithm=powersgd",
                           "compression.warmup_steps=0"])
