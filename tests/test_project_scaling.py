"""bench/project_scaling.py (sparse_asr/analysis/scaling.py, scaling_report.py): closed forms against data
movement counted rank by rank, their ordering as P grows, and exact reproduction of measured points (written
records and a real comm_volume run)."""
import contextlib
import io
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from sparse_asr.analysis import scaling, scaling_report
from tests.mpi_helpers import check_mpi

N = scaling.LSTMAN4_NUMEL
MODEL = scaling.Model(alpha_s=2e-6, beta_s_per_byte=1 / 12.5e9, compute_fixed_ms=20.0, compute_per_utt_ms=1.5,
                 global_batch=64, selection_ms={})


def counted_words(algorithm: str, P: int, n: int, k: int) -> tuple[float, float]:
    """Words and messages one rank receives / sends, counted transfer by transfer (the slowest rank)."""
    words = messages = 0.0
    if algorithm == "dense":  # ring: reduce-scatter then allgather, P-1 chunks of n/P each way
        for _phase in range(2):
            for _step in range(P - 1):
                words += n / P
                messages += 1
    elif algorithm in ("topka", "gaussiank"):  # every other rank's k pairs
        for src in range(P):
            if src != 0:
                words += 2 * k
                messages += 1
        if algorithm == "gaussiank":
            messages += P - 1  # the count exchange before the allgatherv
    elif algorithm == "gtopk":  # the root: k pairs in at each merge round, k pairs out at each broadcast round
        rounds = 0
        while (1 << rounds) < P:
            rounds += 1
        for _ in range(rounds):
            words += 2 * k + 2 * k
            messages += 2
    elif algorithm == "oktopk":  # region share k/P pairs from each other rank, then the others' share of k
        for src in range(P):
            if src != 0:
                words += 2 * k / P  # split and reduce
                words += 2 * k / P  # allgatherv of the global top-k, balanced
                messages += 2
        rounds = 0
        while (1 << rounds) < P:
            rounds += 1
        messages += 2 * rounds  # threshold / size exchanges
    return words, messages


@pytest.mark.parametrize("algorithm", ["dense", "topka", "gaussiank", "gtopk", "oktopk"])
@pytest.mark.parametrize("P", [2, 3, 4, 7, 8, 64, 256])
@pytest.mark.unit
def test_closed_forms_equal_counted_transfers(algorithm, P):
    density = 0.02
    k = round(density * N)
    nbytes, messages = scaling.closed_form(algorithm, P, N, density)
    words, expected_messages = counted_words(algorithm, P, N, k)
    assert nbytes == pytest.approx(words * 4, rel=1e-12)
    assert messages == expected_messages


@pytest.mark.unit
def test_topkdsa_fill_in_and_dense_switch():
    n, d = 1_000_000, 0.02
    k = round(d * n)
    for P in (2, 4, 8, 16, 19, 20, 32, 256):
        union = n * (1 - (1 - d) ** P)
        nbytes, _ = scaling.closed_form("topkdsa", P, n, d)
        low, high = 4 * k * (P - 1) / P, 2 * k * (P - 1) / P + n * (P - 1) / P  # the paper's range
        assert low * 4 <= nbytes <= high * 4 + 1e-6
        if union > n / 3:  # past a third of the entries the allgather goes dense
            assert nbytes == pytest.approx((2 * k + n) * (P - 1) / P * 4)
        else:
            assert nbytes == pytest.approx((2 * k + 2 * union) * (P - 1) / P * 4)
    assert scaling.closed_form("dense", 1, n, d) == (0.0, 0.0)


@pytest.mark.unit
def test_ordering_as_P_grows():
    sparse = [a for a in scaling.algorithms() if a in scaling.IN_PAPER]  # the paper's comparison; PowerSGD's below
    df = scaling.project(sparse, [4, 16, 64, 256], N, 0.02, [], MODEL)

    def at(P, column):
        return df[df.P == P].set_index("algorithm")[column]

    for P in (64, 256):
        volume = at(P, "MB_per_step")
        # Ok-Topk's O(k) < gTopk's O(k log P) < TopkDSA (fill-in, then dense) < dense < TopkA's O(kP)
        assert volume.oktopk < volume.gtopk < volume.topkdsa < volume.dense < volume.topka == volume.gaussiank
        assert at(P, "comm_ms").idxmin() == "oktopk"
        assert at(P, "speedup_vs_dense").idxmax() == "oktopk"
    # TopkA beats dense only while P < 1/density
    assert at(16, "MB_per_step").topka < at(16, "MB_per_step").dense
    # Ok-Topk's volume stays inside the paper's bounds [2k(P-1)/P, 6k(P-1)/P] words
    k = round(0.02 * N)
    for P in (4, 16, 64, 256):
        words = at(P, "MB_per_step").oktopk * 1e6 / 4
        assert 2 * k * (P - 1) / P <= words <= 6 * k * (P - 1) / P
    # the model's arithmetic
    row = df[(df.P == 64) & (df.algorithm == "gtopk")].iloc[0]
    assert row.comm_ms == pytest.approx(1e3 * (2e-6 * row.messages + row.MB_per_step * 1e6 / 12.5e9))
    assert row.compute_ms == 20.0 + 1.5 * 1  # 64 utterances over 64 ranks
    assert df[df.algorithm == "dense"].speedup_vs_dense.tolist() == [1.0] * 4


@pytest.mark.unit
def test_every_registered_algorithm_is_projected(tmp_path):
    """The default command line tables every algorithm of the registry, in its order (a compressor registered
    later included: tests/test_registry.py)."""
    from sparse_asr.compression import COMPRESSORS

    code, _ = main("--out", tmp_path, "--ranks", "4")
    assert code == 0
    assert list(pd.read_csv(tmp_path / "scaling.csv").algorithm) == list(COMPRESSORS)


@pytest.mark.parametrize("rank", [1, 4])
@pytest.mark.unit
def test_powersgd_volume_follows_lstman4_shapes_and_rank_not_density(rank):
    # lstman4: 14 matrices with 50,069 rows + columns in all, 40,192 entries in vectors sent whole
    # (tests/test_powersgd.py counts them); three ring allreduces of 2(P-1)/P words per entry
    options = {"powersgd": {"matrix_approximation_rank": rank}}
    for density in (0.01, 0.02):
        df = scaling.project(["powersgd"], [4, 64], N, density, [], MODEL, options).set_index("P")
        for P in (4, 64):
            assert df.loc[P, "MB_per_step"] * 1e6 == pytest.approx(4 * 2 * (rank * 50_069 + 40_192) * (P - 1) / P)
            assert df.loc[P, "messages"] == 3 * 2 * (P - 1)
            assert df.loc[P, "density"] == 1.0
    # a size no registered model has: one vector, sent whole like dense
    assert scaling.closed_form("powersgd", 4, 1000, 0.02) == scaling.closed_form("dense", 4, 1000, 1.0)


@pytest.mark.parametrize("item, message", [
    ("powersgd.rank=4", "algorithm 'powersgd': unknown key 'compression.options.rank'"),
    ("powersgd.matrix_approximation_rank=0", "matrix_approximation_rank must be >= 1"),
    ("matrix_approximation_rank=4", "expected ALGO.KEY=VALUE"),
])
@pytest.mark.unit
def test_bad_options_are_named(item, message):
    with pytest.raises(SystemExit, match=message):
        scaling_report.parse_algorithm_options([item])


def record(algorithm, P, numel, density, recv_max, sent_max, messages_max):
    """A record as bench/comm_volume.py --json writes it (the fields project_scaling reads, and others)."""
    return {"algorithm": algorithm, "P": P, "numel": numel, "density": density, "k": round(density * numel),
            "bytes_recv_mean": recv_max * 0.9, "bytes_recv_max": recv_max, "bytes_sent_mean": sent_max * 0.9,
            "bytes_sent_max": sent_max, "messages": messages_max - 0.5, "messages_mean": messages_max - 0.5,
            "messages_max": messages_max, "seconds_comm_mean": 0.1}


def write_measured(path: Path, P: int, records: list[dict]) -> Path:
    path.write_text(json.dumps({"config": {"P": P}, "formulas": {}, "records": records}))
    return path


@pytest.mark.unit
def test_measured_points_are_reproduced_and_the_ratio_carries_on(tmp_path):
    n, d = 1_000_000, 0.02
    files = [
        write_measured(tmp_path / "P2.json", 2, [record("oktopk", 2, n, d, 250_000.0, 240_000.0, 11.5),
                                                   record("gtopk", 2, n, d, 80_000.0, 81_000.0, 1.0),
                                                   record("dense", 2, n, d, 4_000_000.0, 4_000_000.0, 2.0)]),
        write_measured(tmp_path / "P8.json", 8, [record("oktopk", 8, n, d, 400_000.0, 390_000.0, 40.0),
                                                   record("dense", 8, n, d, 7_000_000.0, 7_000_000.0, 14.0)]),
    ]
    measured = [m for f in files for m in scaling.load_measured(f)]
    df = scaling.project(["dense", "oktopk", "gtopk"], [2, 4, 8, 32], n, d, measured, MODEL)
    df = df.set_index(["algorithm", "P"])
    # at measured P: the measured figures exactly (gTopk: the root's receives + sends, 2 x messages)
    for (algorithm, P), nbytes, messages in [(("oktopk", 2), 250_000.0, 11.5), (("oktopk", 8), 400_000.0, 40.0),
                                             (("gtopk", 2), 161_000.0, 2.0), (("dense", 8), 7_000_000.0, 14.0)]:
        row = df.loc[(algorithm, P)]
        assert (row.source, row.MB_per_step * 1e6, row.messages) == ("measured", nbytes, messages)
        assert row.comm_ms == pytest.approx(1e3 * (2e-6 * messages + nbytes / 12.5e9), rel=1e-12)

    def ratio(P):
        b, m = scaling.closed_form("oktopk", P, n, d)
        measured_bytes, measured_messages = {2: (250_000.0, 11.5), 8: (400_000.0, 40.0)}[P]
        return measured_bytes / b, measured_messages / m

    # between measured points: the ratio interpolated in log2 P (P=4 is halfway between 2 and 8)
    b4, m4 = scaling.closed_form("oktopk", 4, n, d)
    row = df.loc[("oktopk", 4)]
    assert row.source == "calibrated"
    assert row.MB_per_step * 1e6 == pytest.approx(b4 * (ratio(2)[0] + ratio(8)[0]) / 2, rel=1e-12)
    assert row.messages == pytest.approx(m4 * (ratio(2)[1] + ratio(8)[1]) / 2, rel=1e-12)
    # beyond: the ratio of the nearest measured P
    b32, m32 = scaling.closed_form("oktopk", 32, n, d)
    assert df.loc[("oktopk", 32)].MB_per_step * 1e6 == pytest.approx(b32 * ratio(8)[0], rel=1e-12)
    assert df.loc[("oktopk", 32)].messages == pytest.approx(m32 * ratio(8)[1], rel=1e-12)
    # an algorithm measured at P=2 only keeps that ratio everywhere
    bg, _ = scaling.closed_form("gtopk", 2, n, d)
    b32g, _ = scaling.closed_form("gtopk", 32, n, d)
    assert df.loc[("gtopk", 32)].MB_per_step * 1e6 == pytest.approx(b32g * 161_000.0 / bg, rel=1e-12)


@pytest.mark.unit
def test_oktopk_allgatherv_plain_vs_rebalanced(tmp_path):
    """The ring model: P-1 steps each as long as the largest block; re-cutting the blocks first costs
    what the busiest rank receives for it. Measured shapes come from Ok-Topk's per-step figures."""
    k, pb, alpha, beta = 500_000, 8, 2e-6, 1 / 12.5e9
    plain = scaling.allgatherv_ms(4, k, 1.2, 0.1 * k / 4, 2, MODEL, rebalance=False)
    rebalanced = scaling.allgatherv_ms(4, k, 1.2, 0.1 * k / 4, 2, MODEL, rebalance=True)
    assert plain == pytest.approx(1e3 * 3 * (alpha + beta * pb * 1.2 * k / 4))
    assert rebalanced == pytest.approx(1e3 * (3 * (alpha + beta * pb * k / 4) + 2 * alpha + beta * pb * 0.1 * k / 4))
    # at P = 2 the excess moves once either way: re-cutting only adds its message
    assert scaling.allgatherv_ms(2, k, 1.2, 0.2 * k / 2, 1, MODEL, True) > \
        scaling.allgatherv_ms(2, k, 1.2, 0.2 * k / 2, 1, MODEL, False)
    n, d = 1_000_000, 0.02
    rec = record("oktopk", 4, n, d, 250_000.0, 240_000.0, 11.5)
    rec.update(extra_global_count_mean=1.1 * rec["k"], extra_allgather_imbalance_before_mean=1.2,
               extra_rebalance_pairs_in_max=0.1 * 1.1 * rec["k"] / 4, extra_rebalance_messages_in_max=2.0)
    shapes = scaling.load_allgather_shapes([write_measured(tmp_path / "P4.json", 4,
                                                      [rec, record("dense", 4, n, d, 1.0, 1.0, 6)])])
    assert shapes == [scaling.AllgatherShape(P=4, pairs_over_k=pytest.approx(1.1), imbalance=1.2,
                                        moved_over_block=pytest.approx(0.1), moved_messages=2.0)]
    table = scaling.allgather_table(shapes, [2, 4, 8], n, d, MODEL)
    row = next(line for line in table.splitlines() if line.startswith("| 4 |")).split(" | ")
    assert row[1] == "measured" and float(row[5]) == pytest.approx(
        scaling.allgatherv_ms(4, 1.1 * 20_000, 1.2, 0.1 * 1.1 * 20_000 / 4, 2, MODEL, False), abs=1e-3)
    assert "| 8 | held |" in table and "| 2 | held |" in table


def main(*args) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = scaling_report.main([str(a) for a in args])
    return code, out.getvalue()


@pytest.mark.unit
def test_command_line_without_measurements(tmp_path):
    code, text = main("--out", tmp_path, "--ranks", "8", "64", "256")
    assert code == 0
    assert "closed forms only (no --measured input: nothing here was measured)" in text
    assert "ASSUMED A100 figure, not measured" in text
    assert "Ok-Topk has the lowest communication time from P=8 on" in text
    assert "PowerSGD's communication time over Ok-Topk's (a low-rank scheme, not in the paper)" in text
    assert (tmp_path / "scaling.md").read_text() in text
    assert (tmp_path / "scaling.png").stat().st_size > 20_000
    table = pd.read_csv(tmp_path / "scaling.csv")
    assert sorted(set(table.P)) == [8, 64, 256] and set(table.source) == {"closed form"}


@pytest.mark.unit
def test_bad_measured_input_is_named(tmp_path):
    bad = write_measured(tmp_path / "bad.json", 2, [{"algorithm": "oktopk", "P": 2, "numel": 10, "density": 0.1}])
    with pytest.raises(SystemExit, match=r"bad.json record 0: missing field \(one of bytes_recv_max\)"):
        scaling.load_measured(bad)
    unknown = write_measured(tmp_path / "unknown.json", 2, [record("topk9", 2, 10, 0.1, 1.0, 1.0, 1.0)])
    with pytest.raises(SystemExit, match="unknown.json record 0: unknown algorithm 'topk9'"):
        scaling.load_measured(unknown)
    with pytest.raises(SystemExit, match="missing.json"):
        scaling.load_measured(tmp_path / "missing.json")


@pytest.mark.mpi
def test_real_comm_volume_run_is_reproduced(tmp_path):
    """bench/comm_volume.py at P=2 (small gradient, 3 steps), then the projection at the same size."""
    numel, density = 100_000, 0.02
    measured_json = tmp_path / "comm_volume_P2.json"
    check_mpi(2, ["bench/comm_volume.py", "--numel", str(numel), "--density", str(density), "--steps", "3",
                  "--json", str(measured_json), "--algorithms", *scaling.algorithms()], timeout=300)
    code, _ = main("--measured", measured_json, "--numel", numel, "--density", density, "--ranks", "2", "16",
                   "--out", tmp_path / "out")
    assert code == 0
    table = pd.read_csv(tmp_path / "out" / "scaling.csv").set_index(["algorithm", "P"])
    records = json.loads(measured_json.read_text())["records"]
    assert {r["algorithm"] for r in records} == set(scaling.algorithms())
    for r in records:
        row = table.loc[(r["algorithm"], 2)]
        critical = r["bytes_recv_max"] + (r["bytes_sent_max"] if r["algorithm"] == "gtopk" else 0)
        messages = r["messages_max"] * (2 if r["algorithm"] == "gtopk" else 1)
        assert row.source == "measured"
        assert row.MB_per_step * 1e6 == pytest.approx(critical, rel=1e-12)
        assert row.messages == pytest.approx(messages, rel=1e-12)
        assert table.loc[(r["algorithm"], 16)].source == "calibrated"
    # dense allreduce and TopkA volumes are deterministic: the closed forms hold exactly at P=2
    for algorithm in ("dense", "topka"):
        assert table.loc[(algorithm, 2)].MB_per_step * 1e6 == scaling.closed_form(algorithm, 2, numel, density)[0]
        assert math.isclose(table.loc[(algorithm, 16)].MB_per_step * 1e6,
                            scaling.closed_form(algorithm, 16, numel, density)[0], rel_tol=1e-12)
