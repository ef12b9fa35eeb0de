"""Decoders (sparse_asr/decoding): the lexicon beam corrects what greedy misspells, the Witten-Bell n-gram equals a
hand-computed case, nltk's estimate and what KenLM reads back from the ARPA file, the LM sees training text only."""
import math
import random

import pytest
import torch

from sparse_asr.data.text import LABELS
from sparse_asr.decoding import BeamDecoder, BeamSettings, GreedyDecoder, decode_each, make_decoder
from sparse_asr.decoding.lm import build_lm, lm_dir_for, read_json, write_lm
from sparse_asr.decoding.ngram import WittenBell



def emission(frames: list[dict]) -> torch.Tensor:
    """(T, C) log-probabilities: each frame gives its characters the probabilities named ('_' the blank), the
    rest shared by the other labels."""
    out = torch.full((len(frames), len(LABELS)), 1e-4)
    for t, probs in enumerate(frames):
        for char, p in probs.items():
            out[t, LABELS.index(char)] = p
    return (out / out.sum(1, keepdim=True)).log()


def spoken(word: str, doubt: dict[int, dict] = ()) -> list[dict]:
    """Frames saying `word` clearly (a character, then a blank), except positions in `doubt` (their frame's
    probabilities given)."""
    frames = []
    for i, char in enumerate(word):
        frames += [dict(doubt).get(i, {char: 0.9}), {"_": 0.9}]
    return frames


@pytest.mark.unit
def test_the_lexicon_beam_corrects_a_misspelling_the_greedy_path_makes(tmp_path):
    # the last letter of SEVEN sounds more like M: greedy writes SEVEM, a word no training text has
    log_probs = emission(spoken("SEVEN", {4: {"M": 0.5, "N": 0.4, "_": 0.05}}) + [{" ": 0.9}]
                         + spoken("TWO"))
    lm_dir = write_lm([["SEVEN", "TWO"], ["SEVENTY"], ["SEVEN"], ["TWO", "FOUR"]], tmp_path / "lm", order=2)
    greedy = decode_each(GreedyDecoder(), [log_probs])
    lexicon_free = decode_each(BeamDecoder(BeamSettings(beam_size=8)), [log_probs])
    with_lexicon = decode_each(BeamDecoder(BeamSettings(8, 0.0, 0.0), lm_dir / "lexicon.txt"), [log_probs])
    with_lm = decode_each(BeamDecoder(BeamSettings(8, 1.0, 0.0), lm_dir / "lexicon.txt", lm_dir / "lm.arpa"),
                          [log_probs])
    assert greedy == ["SEVEM TWO"] and lexicon_free == ["SEVEM TWO"]
    assert with_lexicon == ["SEVEN TWO"] and with_lm == ["SEVEN TWO"]


@pytest.mark.unit
def test_the_language_model_chooses_between_two_words_the_sounds_leave_open(tmp_path):
    """FOUR or FOUL after TWO, the sounds slightly for FOUL: the LM, which only saw TWO FOUR, decides."""
    log_probs = emission(spoken("TWO") + [{" ": 0.9}] + spoken("FOUR", {3: {"L": 0.48, "R": 0.47}}))
    lm_dir = write_lm([["TWO", "FOUR"]] * 5 + [["FOUL"]], tmp_path / "lm", order=2)
    lexicon, arpa = lm_dir / "lexicon.txt", lm_dir / "lm.arpa"
    assert decode_each(BeamDecoder(BeamSettings(8, 0.0, 0.0), lexicon), [log_probs]) == ["TWO FOUL"]
    assert decode_each(BeamDecoder(BeamSettings(8, 1.0, 0.0), lexicon, arpa), [log_probs]) == ["TWO FOUR"]


# Hand-computed: sentences "A B" and "A", bigram. Unigram counts A 2, B 1, </s> 2 (of 5; <s> is never predicted).
# After <s>: {A: 2}, c = 2, N1+ = 1, gamma = 1/3. After A: {B: 1, </s>: 1}, c = 2, N1+ = 2, gamma = 1/2.
# After B: {</s>: 1}, c = 1, N1+ = 1, gamma = 1/2.
HAND = {("A", ("<s>",)): (2 + 2 / 5) / 3, ("B", ("<s>",)): (1 / 5) / 3, ("</s>", ("<s>",)): (2 / 5) / 3,
        ("B", ("A",)): (1 + 2 / 5) / 4, ("</s>", ("A",)): (1 + 2 * 2 / 5) / 4, ("A", ("A",)): (2 * 2 / 5) / 4,
        ("</s>", ("B",)): (1 + 2 / 5) / 2, ("A", ("B",)): (2 / 5) / 2, ("A", ()): 2 / 5, ("B", ()): 1 / 5}


@pytest.mark.unit
def test_the_witten_bell_estimate_equals_a_hand_computed_case():
    model = WittenBell([["A", "B"], ["A"]], order=2)
    for (word, context), expected in HAND.items():
        assert model.prob(word, context) == pytest.approx(expected, rel=1e-12), (word, context)
    assert model.gamma(("A",)) == pytest.approx(1 / 2) and model.gamma(("<s>",)) == pytest.approx(1 / 3)
    assert model.prob("A", ("C",)) == pytest.approx(2 / 5)  # an unseen context: the lower order alone


def kenlm(arpa, words):
    from flashlight.lib.text.decoder.kenlm import KenLM
    from flashlight.lib.text.dictionary import Dictionary

    vocabulary = Dictionary()
    for word in words:
        vocabulary.add_entry(word)
    return KenLM(str(arpa), vocabulary), vocabulary


def kenlm_log10(lm, vocabulary, words: list[str]) -> list[float]:
    """KenLM's log10 P of each word of a sentence after <s>, then of </s>."""
    state, scores = lm.start(False), []
    for word in words:
        state, score = lm.score(state, vocabulary.get_index(word))
        scores.append(score)
    scores.append(lm.finish(state)[1])
    return scores


@pytest.mark.unit
def test_kenlm_reads_the_arpa_file_back_as_the_hand_computed_probabilities(tmp_path):
    """The decoder's LM (flashlight's KenLM) on the ARPA file: seen bigrams and backed-off unseen ones."""
    lm_dir = write_lm([["A", "B"], ["A"]], tmp_path, order=2)
    lm, vocabulary = kenlm(lm_dir / "lm.arpa", ["A", "B", "</s>", "<unk>"])
    assert kenlm_log10(lm, vocabulary, ["A", "B"]) == pytest.approx(
        [math.log10(HAND["A", ("<s>",)]), math.log10(HAND["B", ("A",)]), math.log10(HAND["</s>", ("B",)])], abs=1e-6)
    assert kenlm_log10(lm, vocabulary, ["B", "A", "A"]) == pytest.approx(  # B A, A A: unseen bigrams
        [math.log10(HAND["B", ("<s>",)]), math.log10(HAND["A", ("B",)]), math.log10(HAND["A", ("A",)]),
         math.log10(HAND["</s>", ("A",)])], abs=1e-6)


def random_corpus(seed: int, sentences: int = 60) -> list[list[str]]:
    rng = random.Random(seed)
    words = ["ONE", "TWO", "THREE", "ENTER", "ERASE", "A", "B", "RUBOUT"]
    return [[rng.choice(words[: rng.randint(2, 8)]) for _ in range(rng.randint(1, 6))] for _ in range(sentences)]


@pytest.mark.unit
def test_the_trigram_equals_nltks_witten_bell_and_kenlms_reading_of_it(tmp_path):
    """nltk.lm.WittenBellInterpolated fitted on the same n-grams (one <s>, the unigram <s> not counted, as
    SRILM and KenLM pad) gives the same probability for every word in every context of a random corpus."""
    nltk_lm = pytest.importorskip("nltk.lm")
    from nltk.util import everygrams

    corpus = random_corpus(0)
    ours = WittenBell(corpus, order=3)
    grams = [[g for g in everygrams(["<s>", *words, "</s>"], max_len=3) if g != ("<s>",)] for words in corpus]
    theirs = nltk_lm.WittenBellInterpolated(3)
    theirs.fit(grams, [w for words in corpus for w in words] + ["<s>", "</s>"])  # (else counted as <UNK>)
    predicted = ours.vocabulary() + ["</s>"]
    contexts = [()] + [(w,) for w in predicted + ["<s>"]] + [("<s>", w) for w in predicted] + \
        [(a, b) for a in predicted for b in predicted]
    for context in contexts:
        for word in predicted:
            assert ours.prob(word, context) == pytest.approx(theirs.unmasked_score(word, context), rel=1e-9), \
                (word, context)
        assert sum(ours.prob(w, context) for w in predicted) == pytest.approx(1.0)
    lm_dir = write_lm(corpus, tmp_path, order=3)
    lm, vocabulary = kenlm(lm_dir / "lm.arpa", predicted + ["<unk>"])
    for words in random_corpus(1, sentences=20):  # other sentences: seen and unseen trigrams
        padded = ["<s>", *words, "</s>"]
        expected = [math.log10(ours.prob(padded[i], padded[max(0, i - 2):i])) for i in range(1, len(padded))]
        assert kenlm_log10(lm, vocabulary, words) == pytest.approx(expected, abs=1e-5), words


def write_csv(path, transcripts):
    rows = "".join(f"a{i}.wav,1.0,{t},u{i},s\n" for i, t in enumerate(transcripts))
    path.write_text("audio,duration,transcript,utt_id,speaker\n" + rows)
    return path


@pytest.mark.unit
def test_the_lm_reads_the_training_transcripts_only(tmp_path):
    """A word planted in the dev and test transcripts only is outside the lexicon and the LM."""
    train = write_csv(tmp_path / "an4_train.csv", ["ENTER SIX", "ERASE A B", "RUBOUT TWO"])
    write_csv(tmp_path / "an4_dev.csv", ["ENTER PLANTED"])
    write_csv(tmp_path / "an4_test.csv", ["PLANTED TWO"])
    lm_dir = lm_dir_for(train, order=2, root=tmp_path / "lm")
    lexicon = [line.split()[0] for line in (lm_dir / "lexicon.txt").read_text().splitlines()]
    assert sorted(lexicon) == ["A", "B", "ENTER", "ERASE", "RUBOUT", "SIX", "TWO"]
    arpa_words = {line.split("\t")[1] for line in (lm_dir / "lm.arpa").read_text().splitlines() if "\t" in line}
    assert "PLANTED" not in " ".join(arpa_words) and "ENTER SIX" in arpa_words
    write_csv(train, ["ENTER SIX", "ERASE A B", "RUBOUT TWO", "GO"])  # changed transcripts: rebuilt
    assert "GO" in (lm_for := lm_dir_for(train, order=2, root=tmp_path / "lm")).joinpath("lexicon.txt").read_text()
    assert lm_for == lm_dir


@pytest.mark.unit
def test_make_decoder_names_what_it_decodes_with(tmp_path):
    build_lm(write_csv(tmp_path / "an4_train.csv", ["SEVEN TWO", "TWO"]), tmp_path / "lm", order=2)
    assert make_decoder("greedy").name == "greedy"
    assert make_decoder("beam", lm="none", beam_size=4).name == "beam 4"
    named = make_decoder("beam", lm=str(tmp_path / "lm"), beam_size=4, lm_weight=0.5, word_score=1).name
    assert named == "beam 4 + lexicon + 2-gram LM (lm_weight 0.5, word_score 1)"
    with pytest.raises(ValueError, match="greedy, beam"):
        make_decoder("viterbi")


@pytest.mark.unit
def test_tuning_on_dev_emissions_writes_the_grid_beside_the_lm_and_refuses_a_test_set(tmp_path, capsys):
    import json

    from sparse_asr.decoding import tune
    from sparse_asr.training.emissions import save_emissions

    log_probs = emission(spoken("SEVEN", {4: {"M": 0.5, "N": 0.4, "_": 0.05}}) + [{" ": 0.9}] + spoken("TWO"))
    save_emissions(tmp_path / "dev.npz", ["u0", "u1"], [log_probs, log_probs])
    write_csv(tmp_path / "an4_dev.csv", ["SEVEN TWO", "SEVEN TWO"])
    lm_dir = write_lm([["SEVEN", "TWO"], ["TWO"]], tmp_path / "lm", order=2)
    tune.main(["--emissions", str(tmp_path / "dev.npz"), "--manifest", str(tmp_path / "an4_dev.csv"),
               "--lm", str(lm_dir)])
    tuned = json.loads((lm_dir / "tuned.json").read_text())
    assert len(tuned["grid"]) == 60 and tuned["best"]["wer"] == 0.0
    # every point decodes both right: ties go to the smaller beam and lm_weight, the word_score nearest 0
    assert (tuned["best"]["beam_size"], tuned["best"]["lm_weight"], tuned["best"]["word_score"]) == (16, 0.0, 0.0)
    assert "best: beam 16, lm_weight 0, word_score 0: dev WER 0.0000" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="tune on dev only"):
        tune.main(["--emissions", "x.npz", "--manifest", str(tmp_path / "an4_test.csv"), "--lm", str(lm_dir)])


@pytest.mark.data
def test_the_beam_decodes_the_same_emissions_alike_every_time(an4_manifests, tmp_path):
    """Kept emissions (steps of 1/16 nat) tie often, and flashlight orders equal hypotheses by chance: without
    decoders.break_ties, fresh decoders of one file give different texts within a few tries."""
    from pathlib import Path

    from sparse_asr.training.emissions import load_emissions

    kept = Path(__file__).resolve().parent.parent / "docs/results/verdict_p4x4/runs/dense-s6/emissions_test.npz"
    _, log_probs = load_emissions(kept)
    lm_dir = lm_dir_for(an4_manifests / "an4_train.csv", order=3, root=tmp_path)
    texts = set()
    for _ in range(4):
        decoder = BeamDecoder(BeamSettings(16, 0.0, 0.0), lm_dir / "lexicon.txt")
        texts.add(tuple(decode_each(decoder, log_probs)))
    assert len(texts) == 1


@pytest.mark.unit
def test_an_lm_directory_with_a_planted_link_is_refused(tmp_path):
    lm_dir = write_lm([["SEVEN", "TWO"]], tmp_path / "lm", order=2)
    (lm_dir / "lm.arpa").rename(tmp_path / "elsewhere.arpa")
    (lm_dir / "lm.arpa").symlink_to(tmp_path / "elsewhere.arpa")
    with pytest.raises(OSError, match="lm.arpa"):
        make_decoder("beam", lm=str(lm_dir))
    (lm_dir / "lm.json").unlink()
    (lm_dir / "lm.json").symlink_to(tmp_path / "elsewhere.arpa")
    with pytest.raises(OSError, match="lm.json"):
        read_json(lm_dir / "lm.json")
