import random

import pytest
import torch

from sparse_asr.training.scoring import ErrorCounts, char_errors, word_errors

pytestmark = pytest.mark.unit


def reference_edit_distance(a, b):
    """Plain dynamic-programming Levenshtein distance over two sequences (independent of the library)."""
    previous = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        current = [i]
        for j, y in enumerate(b, 1):
            current.append(min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (x != y)))
        previous = current
    return previous[-1]


@pytest.mark.parametrize("ref, hyp, expected", [
    ("A B C", "A B C", (0, 3)),
    ("A B C", "A X C", (1, 3)),            # one substitution
    ("A B C", "X Y C", (2, 3)),            # two substitutions
    ("A B", "A B C", (1, 2)),              # one insertion
    ("A B", "X A B C", (2, 2)),            # two insertions
    ("A B C", "A C", (1, 3)),              # one deletion
    ("A B C D", "B", (3, 4)),              # three deletions
    ("A B C", "", (3, 3)),                 # empty hypothesis: every word deleted
    ("", "", (0, 0)),                      # empty reference, empty hypothesis
    ("", "A B", (2, 0)),                   # empty reference: every word inserted
    ("AB", "A B", (2, 1)),                 # words are atoms: one substitution + one insertion
    ("  A   B ", "A B", (0, 2)),           # whitespace normalised
    ("THE CAT", "the cat", (2, 2)),        # case kept as given
])
def test_word_errors_hand_computed(ref, hyp, expected):
    assert word_errors(ref, hyp) == expected


@pytest.mark.parametrize("ref, hyp, expected", [
    ("CAT", "CUT", (1, 3)),
    ("HELLO WORLD", "HELLO WORD", (1, 11)),    # space counted in the reference length
    ("AB", "A B", (1, 2)),                     # an inserted space is an edit
    ("A B", "AB", (1, 3)),                     # a deleted space is an edit
    ("A  B ", " A B", (0, 3)),                 # whitespace normalised before counting
    ("ABC", "", (3, 3)),
    ("", "", (0, 0)),
    ("", "XY", (2, 0)),
])
def test_char_errors_hand_computed(ref, hyp, expected):
    assert char_errors(ref, hyp) == expected


def test_word_errors_match_dynamic_programming_on_random_sentences():
    rng = random.Random(0)
    vocabulary = ["A", "AN", "AND", "B", "BA", "C", "CAB", "ABC", "ENTER", "SIX"]
    for _ in range(300):
        ref = [rng.choice(vocabulary) for _ in range(rng.randint(0, 9))]
        hyp = [rng.choice(vocabulary) for _ in range(rng.randint(0, 9))]
        assert word_errors(" ".join(ref), " ".join(hyp)) == (reference_edit_distance(ref, hyp), len(ref))
        assert char_errors(" ".join(ref), " ".join(hyp)) == (
            reference_edit_distance(" ".join(ref), " ".join(hyp)), len(" ".join(ref)))


def test_many_distinct_words():
    ref = " ".join(f"W{i}" for i in range(2000))
    hyp = " ".join(f"W{i}" if i % 10 else f"X{i}" for i in range(2000))
    assert word_errors(ref, hyp) == (200, 2000)


def test_corpus_wer_differs_from_mean_utterance_wer():
    counts = ErrorCounts()
    counts.add("A", "B")                                    # 1 edit / 1 word  -> utterance WER 1
    counts.add("A B C D E F G H I", "A B C D E F G H I")   # 0 edits / 9 words -> utterance WER 0
    summary = counts.summary()
    assert summary["wer"] == pytest.approx(1 / 10)
    assert summary["wer_utt_mean"] == pytest.approx(0.5)
    assert summary["cer"] == pytest.approx(1 / (1 + 17))


def test_empty_reference_in_utterance_mean():
    counts = ErrorCounts()
    counts.add("", "")          # scores 0
    counts.add("", "A B C")     # scores 1 (not 3), adds 3 edits to the corpus numerator
    counts.add("A B", "A X")    # scores 0.5
    assert counts.utts == 3
    assert counts.utt_wer_sum == pytest.approx(1.5)
    summary = counts.summary()
    assert summary["wer_utt_mean"] == pytest.approx(0.5)
    assert summary["wer"] == pytest.approx((0 + 3 + 1) / 2)


def test_summary_omits_metrics_with_zero_denominator():
    assert ErrorCounts().summary() == {}
    only_empty = ErrorCounts().add("", "X")
    assert only_empty.summary() == {"wer_utt_mean": 1.0}
    only_loss = ErrorCounts().add_loss(12.0, 4)
    assert only_loss.summary() == {"loss": 3.0}
    full = ErrorCounts().add("AB", "AC").add_loss(5.0, 2)
    assert set(full.summary()) == {"wer", "cer", "wer_utt_mean", "loss"}
    assert full.summary()["cer"] == pytest.approx(0.5)


def test_merge_equals_computing_on_the_union():
    rng = random.Random(1)
    words = ["ONE", "TWO", "THREE", "FOUR", "ENTER", "RUBOUT"]
    pairs = [(" ".join(rng.choices(words, k=rng.randint(0, 6))), " ".join(rng.choices(words, k=rng.randint(0, 6))))
             for _ in range(40)]
    union = ErrorCounts()
    for ref, hyp in pairs:
        union.add(ref, hyp)
    union.add_loss(7.5, 40)

    parts = [ErrorCounts() for _ in range(3)]
    for i, (ref, hyp) in enumerate(pairs):
        parts[i % 3].add(ref, hyp)
    parts[0].add_loss(2.5, 13)
    parts[2].add_loss(5.0, 27)

    added = parts[0] + parts[1] + parts[2]
    merged = ErrorCounts().merge(parts[0]).merge(parts[1]).merge(parts[2])
    for combined in (added, merged):
        assert combined.word_edits == union.word_edits and combined.words == union.words
        assert combined.char_edits == union.char_edits and combined.chars == union.chars
        assert combined.utts == union.utts == 40 and combined.loss_count == union.loss_count
        assert combined.summary() == pytest.approx(union.summary())
    assert parts[1].loss_count == 0  # __add__ does not modify its operands


def test_tensor_round_trip_and_sum_of_tensors():
    a = ErrorCounts().add("A B C", "A C").add("HELLO", "HALLO").add_loss(3.25, 2)
    b = ErrorCounts().add("X Y", "X Y Z").add_loss(1.0, 1)
    t = a.to_tensor()
    assert t.dtype == torch.float64 and t.shape == (8,)
    assert ErrorCounts.from_tensor(t) == a
    # What an allreduce SUM of the tensors gives equals merging the counts.
    summed = ErrorCounts.from_tensor(a.to_tensor() + b.to_tensor())
    assert summed == a + b
    assert isinstance(summed.words, int) and isinstance(summed.loss_sum, float)
    with pytest.raises(ValueError, match="expected 8 values"):
        ErrorCounts.from_tensor(torch.zeros(7))
