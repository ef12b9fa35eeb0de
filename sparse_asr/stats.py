"""Paired comparison over seeds: the mean difference with a Student-t 95% interval, and the verdict.

Runs of two algorithms at the same seeds share the batches, the initial weights and the masks, so
their difference is taken seed by seed (paired) and the interval is that of the mean of those
differences: mean +- t(0.975, n-1) * sd / sqrt(n), sd with n-1 in the denominator. One seed gives no
interval. scipy is not a dependency: `t_quantile` inverts the exact closed-form CDF of Student's t for
integer degrees of freedom (Abramowitz & Stegun 26.7.3 and 26.7.4) by bisection, to about 1e-12.
Counts (how many seeds of each arm stayed on CTC's plateau) are compared by Fisher's exact test, in exact
integer arithmetic.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

# The verdict's margin: "within 5%" of the baseline is this project's question (docs/results.md).
MARGIN_PCT = 5.0


def t_two_sided_coverage(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with `df` degrees of freedom (integer >= 1), in closed form:
    with theta = atan(t / sqrt(df)), c = cos(theta), s = sin(theta),
      df odd:  (2/pi) * (theta + s * (c + 2/3 c^3 + 2*4/(3*5) c^5 + ... up to c^(df-2)))   (A&S 26.7.3)
      df even: s * (1 + 1/2 c^2 + 1*3/(2*4) c^4 + ... up to c^(df-2))                         (A&S 26.7.4)"""
    if not (isinstance(df, int) and df >= 1):
        raise ValueError(f"degrees of freedom must be an integer >= 1, got {df!r}")
    theta = math.atan(abs(t) / math.sqrt(df))
    c, s = math.cos(theta), math.sin(theta)
    if df % 2:
        term, series = c, (c if df > 1 else 0.0)
        for j in range(3, df - 1, 2):  # term of c^j from the one of c^(j-2): x (j-1)/j c^2
            term *= (j - 1) / j * c * c
            series += term
        return 2.0 / math.pi * (theta + s * series)
    term, series = 1.0, 1.0
    for j in range(2, df - 1, 2):  # term of c^j from the one of c^(j-2): x (j-1)/j c^2
        term *= (j - 1) / j * c * c
        series += term
    return s * series


def t_quantile(coverage: float, df: int) -> float:
    """t such that P(|T| <= t) = coverage: the two-sided quantile (coverage 0.95 -> t(0.975, df))."""
    if not 0.0 < coverage < 1.0:
        raise ValueError(f"coverage must be in (0, 1), got {coverage!r}")
    lo, hi = 0.0, math.pi / 2  # bisection on theta = atan(t / sqrt(df)), where the CDF is monotone
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_two_sided_coverage(math.sqrt(df) * math.tan(mid), df) < coverage:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-15:
            break
    return math.sqrt(df) * math.tan((lo + hi) / 2)


@dataclass(frozen=True)
class Interval:
    """Mean of n paired differences and its 95% interval (low, high: None for one difference)."""

    n: int
    mean: float
    low: float | None
    high: float | None


def paired_interval(differences: list[float], coverage: float = 0.95) -> Interval:
    """The mean of `differences` (one per seed) with its Student-t interval over n-1 degrees of freedom."""
    n = len(differences)
    if n == 0:
        raise ValueError("no paired differences")
    if any(not math.isfinite(d) for d in differences):
        raise ValueError(f"paired differences must be finite, got {differences}")
    mean = sum(differences) / n
    if n == 1:
        return Interval(1, mean, None, None)
    sd = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1))
    half = t_quantile(coverage, n - 1) * sd / math.sqrt(n)
    return Interval(n, mean, mean - half, mean + half)


def verdict(relative: Interval, margin: float = MARGIN_PCT) -> str:
    """What the interval of the relative difference (%, algorithm minus baseline, lower is better for
    every metric compared: WER and loss) lets one say, with m = margin:
      one seed (no interval)                 -> "n/a (one seed)"
      low > 0 (excludes 0, above)            -> "worse", "worse by > m%" if low >= m, "worse by < m%" if high <= m
      high < 0 (excludes 0, below)           -> "better", likewise "better by > m%" / "better by < m%"
      low <= -m and high >= m                -> "not resolved" (cannot tell a gap of m% from a tie)
      -m < low and high < m                  -> "within ±m%"
      low <= -m < high < m                   -> "not worse by m%"  (a gap above +m% is excluded, not one below)
      -m < low < m <= high                   -> "not better by m%"
    The ends count as inside (an interval ending exactly at 0 does not exclude 0; one ending at +-m
    holds +-m). A 95% interval inside +-m is a conservative equivalence test (TOST uses a 90% one)."""
    if relative.low is None or relative.high is None:
        return "n/a (one seed)"
    low, high = relative.low, relative.high
    m = f"{margin:g}%"
    if low > 0:
        return "worse by > " + m if low >= margin else "worse by < " + m if high <= margin else "worse"
    if high < 0:
        return "better by > " + m if high <= -margin else "better by < " + m if low >= -margin else "better"
    if low <= -margin and high >= margin:
        return "not resolved"
    if low > -margin and high < margin:
        return f"within ±{m}"
    return "not worse by " + m if high < margin else "not better by " + m


def fisher_exact_two_sided(events_a: int, n_a: int, events_b: int, n_b: int) -> float:
    """Fisher's exact test of two counts (events_a of n_a against events_b of n_b): given the total number of
    events, the chance under 'one shared rate' of a split at most as likely as the one observed, summed over
    every split (the two-sided p of R's fisher.test and scipy's fisher_exact). The splits' probabilities are
    hypergeometric: C(n_a, k) C(n_b, total - k) / C(n_a + n_b, total)."""
    if not (0 <= events_a <= n_a and 0 <= events_b <= n_b):
        raise ValueError(f"counts must lie in 0..n: {events_a} of {n_a}, {events_b} of {n_b}")
    total = events_a + events_b
    ways = math.comb(n_a + n_b, total)
    splits = [math.comb(n_a, k) * math.comb(n_b, total - k) for k in range(max(0, total - n_b), min(total, n_a) + 1)]
    observed = math.comb(n_a, events_a) * math.comb(n_b, events_b)
    # Exact integers: "at most as likely" needs no float tolerance.
    return sum(s for s in splits if s <= observed) / ways
