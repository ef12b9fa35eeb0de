"""Kept log-probabilities (training/emissions.py): within half a code of the model's, its greedy path where a frame's
best two symbols are more than a code apart, and data only (a pickled file is refused)."""
import numpy as np
import pytest
import torch

from sparse_asr.data.text import greedy_decode
from sparse_asr.training.emissions import MAX_CODE, STEP, load_emissions, save_emissions

pytestmark = pytest.mark.unit


def test_saved_emissions_read_back_within_half_a_code_and_decode_alike(tmp_path):
    generator = torch.Generator().manual_seed(0)
    log_probs = [torch.log_softmax(4 * torch.randn(T, 29, generator=generator), dim=1) for T in (7, 1, 40)]
    save_emissions(tmp_path / "e.npz", ["a", "b", "c"], log_probs)
    ids, back = load_emissions(tmp_path / "e.npz")
    assert ids == ["a", "b", "c"] and [b.shape for b in back] == [lp.shape for lp in log_probs]
    floor = -MAX_CODE * STEP
    for original, kept in zip(log_probs, back):
        assert kept.dtype == torch.float32
        inside = original > floor
        assert float((kept - original)[inside].abs().max()) <= STEP / 2 + 1e-6
        assert bool((kept[~inside] == floor).all())
        top2 = original.topk(2, dim=1).values
        clear = (top2[:, 0] - top2[:, 1]) > STEP  # the frames whose best symbol no rounding can change
        assert bool((kept.argmax(1) == original.argmax(1))[clear].all())
    one = [torch.log_softmax(torch.tensor([[0.0, 9, 0] + [0] * 26] * 3 + [[9.0] + [0] * 28]), dim=1)]
    save_emissions(tmp_path / "g.npz", ["g"], one)
    assert greedy_decode(load_emissions(tmp_path / "g.npz")[1][0][:, None], torch.tensor([4])) == \
        greedy_decode(one[0][:, None], torch.tensor([4]))


def test_a_file_holding_objects_is_refused_not_unpickled(tmp_path):
    path = tmp_path / "evil.npz"
    np.savez(path, format=np.array(1), step=np.array(STEP), utt_ids=np.array([object()], dtype=object),
             lengths=np.array([1], dtype=np.int32), codes=np.zeros((1, 29), dtype=np.uint8))
    with pytest.raises(ValueError, match="allow_pickle"):
        load_emissions(path)
    np.savez(tmp_path / "other.npz", codes=np.zeros((1, 29), dtype=np.uint8))
    with pytest.raises(ValueError, match="not an emissions file"):
        load_emissions(tmp_path / "other.npz")
