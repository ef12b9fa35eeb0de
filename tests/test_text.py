import pytest
import torch

from sparse_asr.data.text import BLANK, LABELS, NUM_CLASSES, greedy_decode, ids_to_text, text_to_ids

pytestmark = pytest.mark.unit


def test_labels_layout():
    assert LABELS[BLANK] == "_" and BLANK == 0
    assert LABELS[-1] == " " and NUM_CLASSES == 29
    assert len(set(LABELS)) == NUM_CLASSES


def test_round_trip_and_upper_case():
    text = "RUBOUT G M E F THREE NINE"
    ids = text_to_ids(text)
    assert ids_to_text(ids) == text
    assert text_to_ids("it's") == [LABELS.index(c) for c in "IT'S"]
    assert ids_to_text(torch.tensor(ids)) == text


@pytest.mark.parametrize("bad, char", [("HELLO!", "!"), ("TWO 2", "2"), ("A_B", "_"), ("TAB\tX", "\t")])
def test_unknown_character_is_named(bad, char):
    with pytest.raises(ValueError) as error:
        text_to_ids(bad)
    assert repr(char) in str(error.value)


def test_ids_to_text_rejects_out_of_range():
    with pytest.raises(ValueError, match="29"):
        ids_to_text([1, 29])


def one_hot_log_probs(paths: list[list[int]]) -> torch.Tensor:
    """(T, B, C) log-probs whose argmax at (t, b) is paths[b][t] (shorter paths padded with blanks)."""
    t_max = max(map(len, paths))
    probs = torch.full((t_max, len(paths), NUM_CLASSES), 0.1 / NUM_CLASSES)
    for b, path in enumerate(paths):
        for t in range(t_max):
            probs[t, b, path[t] if t < len(path) else BLANK] = 0.9
    return probs.log()


def ids(text: str) -> list[int]:
    return [LABELS.index(c) for c in text]


def test_greedy_decode_collapses_repeats_and_drops_blanks():
    a, b, o, space = ids("A")[0], ids("B")[0], ids("O")[0], ids(" ")[0]
    paths = [
        [a, a, BLANK, a, b, b],  # repeats collapse; a blank separates a genuine double letter
        [BLANK, BLANK, BLANK],  # all blank -> empty
        [b, o, o, BLANK, o, space, space, a],  # "BOO A"
        [space, a, space, space, BLANK, space, b, space],  # spaces squeezed and stripped
    ]
    log_probs = one_hot_log_probs(paths)
    lengths = torch.tensor([len(p) for p in paths])
    assert greedy_decode(log_probs, lengths) == ["AAB", "", "BOO A", "A B"]


def test_greedy_decode_respects_lengths():
    a, b = ids("A")[0], ids("B")[0]
    log_probs = one_hot_log_probs([[a, BLANK, b, b], [b, a, a, a]])
    assert greedy_decode(log_probs, torch.tensor([2, 4])) == ["A", "BA"]
    assert greedy_decode(log_probs, torch.tensor([0, 1])) == ["", "B"]
