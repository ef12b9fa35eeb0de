"""Dev WER against training time for one or more runs, from their metrics.jsonl.

    .venv/bin/python bench/wer_vs_time.py runs/NAME [runs/OTHER ...]

For each evaluation: epoch, optimizer step, training minutes so far (the sum of the epochs'
wall time, `epoch/seconds`, i.e. without evaluation), dev WER / CER / wer_utt_mean; then the
test figures of the run's end, if it got there. A Markdown table per run on stdout.
"""
import argparse
import sys
from pathlib import Path

from sparse_asr.training.runlog import read_metrics


def read_records(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        sys.exit(f"wer_vs_time: {path} does not exist (not a run directory?)")
    return read_metrics(run_dir)


def table(run_dir: Path) -> str:
    rows, train_seconds = [], 0.0
    test = None
    for r in read_records(run_dir):
        if r["kind"] == "epoch":
            train_seconds += r.get("epoch/seconds", 0.0)
        elif r["kind"] == "dev":
            rows.append((r["epoch"], r["step"], train_seconds / 60, r.get("dev/wer"), r.get("dev/cer"),
                         r.get("dev/wer_utt_mean")))
        elif r["kind"] == "test":
            test = r
    fmt = lambda v: "" if v is None else f"{v:.4f}"  # noqa: E731 -- absent metric: empty cell
    lines = [f"### {run_dir.name}", "", "| epoch | step | training min | dev WER | dev CER | dev wer_utt_mean |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {e} | {s} | {m:.1f} | {fmt(w)} | {fmt(c)} | {fmt(u)} |" for e, s, m, w, c, u in rows]
    if test is not None:
        lines += ["", f"test after {train_seconds / 60:.1f} training minutes: WER {fmt(test.get('test/wer'))}, "
                      f"CER {fmt(test.get('test/cer'))}, wer_utt_mean {fmt(test.get('test/wer_utt_mean'))}"]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    print("\n\n".join(table(d) for d in args.run_dirs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
