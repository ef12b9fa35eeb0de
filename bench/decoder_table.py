"""Does the gap between exchanges survive a better decoder? Test WER of kept runs decoded greedily, by a beam, a beam
with the training lexicon, a beam with lexicon + n-gram LM, and the averaged checkpoints with lexicon + LM, paired by
seed against dense with 95% t intervals (sparse_asr/stats.py).

    .venv/bin/python bench/decoder_table.py docs/results/verdict_p4x4/runs [--average 2 --average-by last]
        [--out docs/results/decoder_table.json] [--reuse]

Runs are directories <algorithm>-s<seed> holding emissions_dev.npz and emissions_test.npz. Every run's beam
settings are tuned on its own dev emissions (decoding/tune.py's grid; never test), the LM is built from
manifests/an4_train.csv only. The averaged column decodes, with the run's dev-tuned LM settings, the test emissions
of the average of its checkpoints where the run keeps them, written when the run was kept:

    evaluate.py RUN --manifest manifests/an4_test.csv --average 2 --average-by last \
        --emissions RUN/emissions_test_avg2_last.npz

Everything is decoded from kept files: the table needs no checkpoint and no model pass. Every column is decoded
twice: flashlight's beam orders hypotheses of exactly equal score by memory address, and where the second decode
gives another WER the table shows both.

With --reuse, a row of the earlier --out file is taken as it is when everything it was computed from is unchanged:
the run's emission files, the LM, the manifests, the decoding code (every .py of sparse_asr/ and this file), torch's
version and the CPU. A table that grows run by run then decodes only the new runs. With --tabulate nothing is
decoded: the --out file's rows are tabled and summarized as they are.

Below the table, what each decoder changes, counted from the rows (`summary`): the lexicon and the LM against what
they add to, the averaged checkpoints against the last model, and how far the better decoder moves each
algorithm's gap to dense, with the seeds where a run never left CTC's plateau (its training log) apart.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
import time
from pathlib import Path

import torch

from sparse_asr.analysis.paired import PLATEAU_EXIT_WER, plateau_exit_step
from sparse_asr.analysis.runs import load_run
from sparse_asr.comm import Communicator
from sparse_asr.decoding import BeamDecoder, BeamSettings, GreedyDecoder, decode_each
from sparse_asr.decoding.lm import lm_dir_for, lm_files
from sparse_asr.decoding.tune import references, tune
from sparse_asr.fileio import atomic_write_text, open_regular, read_text
from sparse_asr.stats import paired_interval
from sparse_asr.training.emissions import load_emissions
from sparse_asr.training.launch import setup_process
from sparse_asr.training.runlog import metrics_path
from sparse_asr.training.runtime import cpu_model
from sparse_asr.training.scoring import ErrorCounts

COLUMNS = ("greedy", "beam", "beam + lexicon", "beam + lexicon + LM")
AVERAGED = "averaged + beam + lexicon + LM"
REPO = Path(__file__).resolve().parent.parent
TABLE_LIMIT = 64 << 20  # bytes of an earlier --out file read back


def file_sha256(path: Path, follow: bool = False) -> str:
    digest = hashlib.sha256()
    with open_regular(path, "input", follow=follow) as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def code_sha256() -> str:
    """Every .py of sparse_asr/ and this file: a change to decoding or to the model voids every reused row."""
    digest = hashlib.sha256()
    for path in sorted((REPO / "sparse_asr").rglob("*.py")) + [Path(__file__).resolve()]:
        digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def averaged_name(args) -> str:
    """The file of a run's test emissions of its averaged checkpoints (evaluate.py --average N --average-by BY)."""
    return f"emissions_test_avg{args.average}_{args.average_by}.npz"


def inputs_of(run_dir: Path, lm_dir: Path, args, code: str) -> dict:
    """What a run's row is computed from; equal inputs give the same row."""
    names = ("emissions_dev.npz", "emissions_test.npz", averaged_name(args))
    inputs = {name: file_sha256(run_dir / name) for name in names if (run_dir / name).exists()}
    inputs["lm"] = {path.name: file_sha256(path) for path in lm_files(lm_dir)}
    inputs["manifests"] = {m: file_sha256(Path(m), follow=True) for m in (args.dev_manifest, args.test_manifest)}
    inputs.update(code=code, torch=torch.__version__, cpu=cpu_model())
    return inputs


def wer_of(decoder, log_probs, refs) -> tuple[float, float]:
    """(corpus WER, seconds spent decoding)."""
    t0 = time.perf_counter()
    counts = ErrorCounts()
    for ref, hyp in zip(refs, decode_each(decoder, log_probs)):
        counts.add(ref, hyp)
    return counts.summary()["wer"], time.perf_counter() - t0


def run_row(run_dir: Path, lm_dir: Path, args) -> dict:
    lexicon, arpa = lm_files(lm_dir)
    dev_ids, dev_lp = load_emissions(run_dir / "emissions_dev.npz")
    print(f"{run_dir.name}: tuning on {len(dev_ids)} dev utterances", flush=True)
    _, grid = tune([(dev_lp, references(args.dev_manifest, dev_ids))], lm_dir, log=lambda line: None)
    best_lm = min((r for r in grid if r["lm_weight"] > 0), key=lambda r: (r["wer"], r["beam_size"], r["lm_weight"]))
    best_lex = min((r for r in grid if r["lm_weight"] == 0), key=lambda r: (r["wer"], r["beam_size"]))
    test_ids, test_lp = load_emissions(run_dir / "emissions_test.npz")
    refs = references(args.test_manifest, test_ids)
    lm_settings = BeamSettings(best_lm["beam_size"], best_lm["lm_weight"], best_lm["word_score"])
    # the lexicon-free beam scores the model alone (no word score); the lexicon alone is decoded as the dev grid
    # scored its settings (tune.py: the LM at lm_weight 0)
    decoders = {"greedy": GreedyDecoder(), "beam": BeamDecoder(BeamSettings(best_lm["beam_size"], 0.0, 0.0)),
                "beam + lexicon": BeamDecoder(BeamSettings(best_lex["beam_size"], 0.0, best_lex["word_score"]),
                                              lexicon, arpa),
                "beam + lexicon + LM": BeamDecoder(lm_settings, lexicon, arpa)}
    row = {"run": run_dir.name, "utterances": len(test_ids), "tuned": {"lm": best_lm, "lexicon": best_lex},
           "dev_grid": [[r["beam_size"], r["lm_weight"], r["word_score"], r["wer"]] for r in grid],
           "wer": {}, "seconds": {}, "decoders": {}}
    to_decode = {column: (decoder, test_lp, refs) for column, decoder in decoders.items()}
    if (run_dir / averaged_name(args)).exists():
        ids, log_probs = load_emissions(run_dir / averaged_name(args))
        to_decode[AVERAGED] = (decoders["beam + lexicon + LM"], log_probs, references(args.test_manifest, ids))
    for column, (decoder, log_probs, column_refs) in to_decode.items():
        row["wer"][column], row["seconds"][column] = wer_of(decoder, log_probs, column_refs)
        row["decoders"][column] = decoder.name
        # flashlight's beam orders hypotheses of exactly equal score by memory address: decode twice, say so
        again, _ = wer_of(decoder, log_probs, column_refs)
        if again != row["wer"][column]:
            row.setdefault("second_decode", {})[column] = again
            print(f"  {column}: a second decode gave WER {again:.4f}, not {row['wer'][column]:.4f}", flush=True)
    print("  " + "  ".join(f"{c} {w:.4f}" for c, w in row["wer"].items()), flush=True)
    return row


def algorithm_and_seed(name: str) -> tuple[str, int] | None:
    """A run named <algorithm>-s<seed> (bench/accuracy.sh's names) -> (algorithm, seed); any other name -> None."""
    m = re.fullmatch(r"(.+)-s(\d+)", name)
    return (m.group(1), int(m.group(2))) if m else None


def paired(rows: dict[str, dict], columns) -> list[tuple[str, str, list, object]]:
    """(algorithm, column, per-seed relative differences in %, interval) against dense-s<seed>."""
    out = []
    names = {key for name in rows if (key := algorithm_and_seed(name))}
    algorithms = sorted({a for a, _ in names} - {"dense"})
    for algorithm in algorithms:
        seeds = sorted(s for a, s in names if a == algorithm and ("dense", s) in names)
        for column in columns:
            diffs = [100 * (rows[f"{algorithm}-s{s}"]["wer"][column] / rows[f"dense-s{s}"]["wer"][column] - 1)
                     for s in seeds if column in rows[f"{algorithm}-s{s}"]["wer"]
                     and column in rows[f"dense-s{s}"]["wer"]]
            if diffs:
                out.append((algorithm, column, diffs, paired_interval(diffs)))
    return out


def run_order(name: str) -> tuple:
    """<algorithm>-s<seed> by algorithm, then seed as a number (dense-s9 before dense-s10)."""
    key = algorithm_and_seed(name)
    return (*key, "") if key else (name, -1, name)


def cell(row: dict, column: str) -> str:
    """A run's WER in a column; where a second decode of the same emissions differed, both."""
    if column not in row["wer"]:
        return ""
    again = row.get("second_decode", {}).get(column)
    return f"{row['wer'][column]:.4f}" + ("" if again is None else f" (again: {again:.4f})")


def markdown(rows: dict[str, dict], columns) -> str:
    lines = ["| run | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for name, row in sorted(rows.items(), key=lambda item: run_order(item[0])):
        lines.append(f"| {name} | " + " | ".join(cell(row, c) for c in columns) + " |")
    lines += ["", "| vs dense, paired by seed | seeds | " + " | ".join(columns) + " |",
              "|---" * (len(columns) + 2) + "|"]
    by_algorithm = {}  # algorithm -> (seeds of its first column, cells); a cell over other seeds names its n
    for algorithm, column, diffs, interval in paired(rows, columns):
        text = f"{interval.mean:+.1f}%" + ("" if interval.low is None else
                                            f" [{interval.low:+.1f}%, {interval.high:+.1f}%]")
        n, cells = by_algorithm.setdefault(algorithm, (len(diffs), {}))
        cells[column] = text + ("" if len(diffs) == n else f" (n = {len(diffs)})")
    for algorithm, (n, cells) in by_algorithm.items():
        lines.append(f"| {algorithm} | {n} | " + " | ".join(cells.get(c, "") for c in columns) + " |")
    return "\n".join(lines)


def relative(a: float, b: float) -> float:
    """a against b in % (against a WER of 0: 0 when a is 0 too, else inf)."""
    return 100 * (a / b - 1) if b else (0.0 if a == 0 else math.inf)


def span(values: list[float], unit: str = "%") -> str:
    """'lowest to highest (mean)'."""
    return f"{min(values):+.1f}{unit} to {max(values):+.1f}{unit} (mean {sum(values) / len(values):+.1f}{unit})"


def on_plateau(run_dir: Path) -> bool | None:
    """Whether the run never left CTC's blank plateau (its training log has no dev WER < PLATEAU_EXIT_WER, the
    rule of compare_runs --spread); None when the directory holds no training log."""
    if metrics_path(run_dir) is None and not any(run_dir.rglob("events.out.tfevents.*")):
        return None
    curves = load_run(run_dir).curves
    return "dev/wer" in curves and math.isinf(plateau_exit_step(curves["dev/wer"]))


def summary(rows: dict[str, dict], plateau: dict[str, bool | None]) -> str:
    """What each decoder changes, counted from the rows: the lexicon and the lexicon-free beam against greedy,
    the LM against the lexicon alone, the averaged checkpoints against the last model, and how the better decoder
    moves each algorithm's gap to dense (points of the paired relative difference, greedy -> beam + lexicon +
    LM), the seeds where either run never left CTC's plateau apart: no decoder rescues a model that has not
    learned."""
    greedy, lexicon, lm = "greedy", "beam + lexicon", "beam + lexicon + LM"
    wer = {name: row["wer"] for name, row in rows.items()}
    dense = [name for name in wer if (algorithm_and_seed(name) or ("",))[0] == "dense"]
    lines = ["What the decoders change (relative to the column named; points: of the paired difference):"]
    if dense:
        lines.append(f"- the lexicon, greedy -> beam + lexicon, on dense's {len(dense)} runs: "
                     + span([relative(wer[n][lexicon], wer[n][greedy]) for n in dense]))
    beam = [abs(relative(w["beam"], w[greedy])) for w in wer.values()]
    lines.append(f"- a lexicon-free beam against greedy: at most {max(beam):.1f}% on any of {len(beam)} runs")
    lower = sorted((n for n, w in wer.items() if w[lm] < w[lexicon]), key=run_order)
    higher = sorted((n for n, w in wer.items() if w[lm] > w[lexicon]), key=run_order)
    lines.append(f"- the LM, beam + lexicon -> + LM: lower on {len(lower)} of {len(wer)} runs, higher on "
                 f"{len(higher)} ({' '.join(higher) or 'none'}), equal on {len(wer) - len(lower) - len(higher)}")
    averaged = {n: relative(w[AVERAGED], w[lm]) for n, w in wer.items() if AVERAGED in w}
    if averaged:
        down = [d for d in averaged.values() if d < 0]
        up = [d for d in averaged.values() if d > 0]
        lines.append(f"- the averaged checkpoints against the last model, both beam + lexicon + LM: lower on "
                     f"{len(down)} of {len(averaged)} runs" + (f" (by up to {-min(down):.1f}%)" if down else "")
                     + f", higher on {len(up)}" + (f" (by up to {max(up):.1f}%)" if up else ""))
    unknown = sorted((n for n in wer if plateau.get(n) is None), key=run_order)
    if unknown:
        lines.append(f"- no training log, so not known to have left CTC's plateau: {' '.join(unknown)}")
    names = {key for name in wer if (key := algorithm_and_seed(name))}
    for algorithm in sorted({a for a, _ in names} - {"dense"}):
        seeds = sorted(s for a, s in names if a == algorithm and ("dense", s) in names)
        gaps = {s: [relative(wer[f"{algorithm}-s{s}"][c], wer[f"dense-s{s}"][c]) for c in (greedy, lm)]
                for s in seeds}
        stuck = [s for s in seeds if plateau.get(f"{algorithm}-s{s}") or plateau.get(f"dense-s{s}")]
        learning = [s for s in seeds if s not in stuck]
        if learning:
            lines.append(f"- {algorithm} against dense on the {len(learning)} seeds where both left CTC's plateau: "
                         f"gap {span([gaps[s][0] for s in learning])} greedy, "
                         f"{span([gaps[s][1] for s in learning])} with beam + lexicon + LM; moved by "
                         + span([gaps[s][1] - gaps[s][0] for s in learning], "") + " points")
        if stuck:
            lines.append(f"- {algorithm} on the seeds where a run stayed on the plateau (dev WER never < "
                         f"{PLATEAU_EXIT_WER:g}): " + "; ".join(
                             f"seed {s} {gaps[s][0]:+.1f}% greedy -> {gaps[s][1]:+.1f}% with LM" for s in stuck))
    return "\n".join(lines)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", help="a directory of kept runs (<algorithm>-s<seed>/emissions_{dev,test}.npz)")
    parser.add_argument("--train-manifest", default="manifests/an4_train.csv")
    parser.add_argument("--dev-manifest", default="manifests/an4_dev.csv")
    parser.add_argument("--test-manifest", default="manifests/an4_test.csv")
    parser.add_argument("--order", type=int, default=3, help="n-gram order (default 3)")
    parser.add_argument("--average", type=int, default=2, help="the averaged column's emissions are those of "
                        "this many checkpoints (default 2) ...")
    parser.add_argument("--average-by", choices=("dev", "last"), default="last", help="... chosen by this rule "
                        "(default last): the file emissions_test_avg<N>_<BY>.npz of each run, where it has one")
    parser.add_argument("--out", help="also write every figure, the tuned settings and the table here (JSON)")
    parser.add_argument("--reuse", action="store_true",
                        help="take the rows of the earlier --out file whose inputs are unchanged (see above)")
    parser.add_argument("--tabulate", action="store_true",
                        help="decode nothing: table and summarize the rows of the --out file as they are (after a "
                             "change to this file's tables, which would otherwise void every reused row)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    for flag in ("reuse", "tabulate"):
        if getattr(args, flag) and not args.out:
            sys.exit(f"decoder_table: --{flag} takes its rows from the --out file: name one")
    setup_process(Communicator(), "cpu", threads=1)  # decoding is one thread's work (break_ties, the beam)
    lm_dir = lm_dir_for(args.train_manifest, args.order)
    run_dirs = sorted(d for d in Path(args.runs).iterdir() if (d / "emissions_test.npz").is_file()
                      and (d / "emissions_dev.npz").is_file())
    if not run_dirs:
        sys.exit(f"decoder_table: no run under {args.runs} holds emissions_dev.npz and emissions_test.npz")
    earlier = {}
    if (args.reuse and Path(args.out).exists()) or args.tabulate:
        try:
            earlier = json.loads(read_text(args.out, TABLE_LIMIT, "decoder table", follow=False))["rows"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"decoder_table: {args.out} is not an earlier table of this bench ({e})")
    rows = {}
    if args.tabulate:
        missing = [d.name for d in run_dirs if not isinstance(earlier.get(d.name), dict)]
        if missing:
            sys.exit(f"decoder_table: --tabulate: {args.out} has no row for {' '.join(missing)}: decode them "
                     f"first (--reuse, without --tabulate)")
        rows = {d.name: earlier[d.name] for d in run_dirs}
    else:
        code = code_sha256()
        for d in run_dirs:
            inputs = inputs_of(d, lm_dir, args, code)
            if isinstance(earlier.get(d.name), dict) and earlier[d.name].get("inputs") == inputs:
                print(f"{d.name}: its inputs are unchanged: row taken from {args.out}", flush=True)
                rows[d.name] = earlier[d.name]
            else:
                rows[d.name] = run_row(d, lm_dir, args) | {"inputs": inputs}
    columns = COLUMNS + ((AVERAGED,) if any(AVERAGED in row["wer"] for row in rows.values()) else ())
    table = markdown(rows, columns)
    print("\ntest WER (LM: " + json.loads((lm_dir / "lm.json").read_text())["smoothing"] + f", order {args.order}, "
          f"{args.train_manifest} only; beam settings tuned on each run's dev emissions)\n")
    print(table)
    text = summary(rows, {d.name: on_plateau(d) for d in run_dirs})
    print("\n" + text)
    seconds = {c: sum(r["seconds"][c] for r in rows.values() if c in r["seconds"])
               / sum(r["utterances"] for r in rows.values() if c in r["seconds"]) for c in columns}
    print("\ndecoding time per test utterance: " + ", ".join(f"{c} {1000 * s:.1f} ms" for c, s in seconds.items()))
    if args.out:
        atomic_write_text(args.out, json.dumps({"rows": rows, "table": table, "summary": text, "ms_per_utterance": {
            c: round(1000 * s, 2) for c, s in seconds.items()}}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
