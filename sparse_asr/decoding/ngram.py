"""A word n-gram language model with interpolated Witten-Bell smoothing, written as an ARPA file for KenLM.

Sentences are padded with one <s> and one </s> (as SRILM and KenLM do); every n-gram of order 1..N is counted,
the unigram <s> excepted (it is never predicted). For a context h with c(h) > 0 tokens following it, of N1+(h)
distinct words, and h' = h without its first word:

    P(w | h) = (c(h w) + N1+(h) P(w | h')) / (c(h) + N1+(h))        gamma(h) = N1+(h) / (c(h) + N1+(h))
    P(w | h) = P(w | h')                                             when h was never seen
    P(w)     = c(w) / (sum of unigram counts)                        the maximum-likelihood unigram

(Witten & Bell 1991; nltk.lm.WittenBellInterpolated computes the same from the same counts: tests/test_decoding.py.)
The ARPA file lists, for every seen n-gram, log10 P(w | h) and, for every seen context, log10 gamma(h) as its
backoff weight: an unseen word then gets gamma(h) P(w | h'), which is the interpolated formula with c(h w) = 0, so
KenLM's backoff evaluation returns exactly these probabilities. <unk> has no mass (-99): the lexicon decoder only
ever proposes words of the lexicon, which are the training words.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict

BOS, EOS, UNK = "<s>", "</s>", "<unk>"
NO_PROB = -99.0  # ARPA's log10 "never": <s> is never predicted, <unk> has no mass


class WittenBell:
    """Interpolated Witten-Bell n-gram model of `sentences` (lists of words), of order `order` >= 1."""

    def __init__(self, sentences: list[list[str]], order: int):
        if order < 1:
            raise ValueError(f"n-gram order must be >= 1, got {order}")
        self.order = order
        self.follow: dict[tuple, Counter] = defaultdict(Counter)  # context (0..order-1 words) -> next-word counts
        for words in sentences:
            padded = [BOS, *words, EOS]
            for i in range(1, len(padded)):  # predict padded[i] from up to order-1 words before it
                for n in range(0, min(order - 1, i) + 1):
                    self.follow[tuple(padded[i - n:i])][padded[i]] += 1
        self.follow = dict(self.follow)
        self.total = sum(self.follow.get((), Counter()).values())
        if not self.total:
            raise ValueError("no words to estimate an n-gram model from")

    def gamma(self, context: tuple) -> float:
        """The weight of the lower order after `context` (1 for a context never seen)."""
        counts = self.follow.get(tuple(context))
        if not counts:
            return 1.0
        distinct = len(counts)
        return distinct / (sum(counts.values()) + distinct)

    def prob(self, word: str, context=()) -> float:
        """P(word | context); only the last order-1 words of the context count."""
        context = tuple(context)[-(self.order - 1):] if self.order > 1 else ()
        if not context:
            return self.follow[()][word] / self.total
        counts = self.follow.get(context)
        lower = self.prob(word, context[1:])
        if not counts:
            return lower
        distinct = len(counts)
        return (counts[word] + distinct * lower) / (sum(counts.values()) + distinct)

    def vocabulary(self) -> list[str]:
        """The words seen in training (</s> and <s> excluded), sorted."""
        return sorted(w for w in self.follow[()] if w != EOS)

    def ngrams(self, n: int) -> list[tuple]:
        """The seen n-grams of order n (a context followed by a word), sorted."""
        return sorted(context + (word,) for context, counts in self.follow.items() if len(context) == n - 1
                      for word in counts)

    def to_arpa(self) -> str:
        """The model as ARPA text (log10 probabilities and backoff weights)."""
        sections = {1: [(w,) for w in sorted(self.follow[()])] + [(BOS,), (UNK,)]}
        for n in range(2, self.order + 1):
            sections[n] = self.ngrams(n)
        lines = ["\\data\\"] + [f"ngram {n}={len(grams)}" for n, grams in sections.items()] + [""]
        for n, grams in sections.items():
            lines.append(f"\\{n}-grams:")
            for gram in grams:
                *context, word = gram
                logp = NO_PROB if gram in ((BOS,), (UNK,)) else math.log10(self.prob(word, context))
                line = f"{logp:.7f}\t{' '.join(gram)}"
                if n < self.order and self.follow.get(gram):
                    line += f"\t{math.log10(self.gamma(gram)):.7f}"
                lines.append(line)
            lines.append("")
        return "\n".join(lines + ["\\end\\", ""])
