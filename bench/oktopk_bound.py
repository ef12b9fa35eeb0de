"""Ok-Topk's measured volume against its bounds and against TopkA and dense, per P.

    .venv/bin/python bench/oktopk_bound.py [--results bench/results] [--procs 2 4 8]

Reads what `bash bench/run_comm_volume.sh` wrote (comm_volume_oktopk_P<P>.json: Ok-Topk over 64
steps; comm_volume_P<P>.json: the baselines) and prints one Markdown row per P: words received per
rank per step (mean over ranks [busiest rank]), the paper's 6k(P-1)/P upper bound, the busiest rank
over it (must be <= 1), the mean over the 2k(P-1)/P lower bound, and TopkA's and dense's volume over
Ok-Topk's.
"""
import argparse
import json
import sys
from pathlib import Path

WORD = 4  # bytes


def load(path: Path) -> dict:
    if not path.is_file():
        sys.exit(f"oktopk_bound: {path} is missing; run bash bench/run_comm_volume.sh first")
    return {r["algorithm"]: r for r in json.loads(path.read_text())["records"]}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--results", type=Path, default=Path("bench/results"))
    parser.add_argument("--procs", type=int, nargs="+", default=[2, 4, 8])
    args = parser.parse_args(argv)
    print("| P | steps | Ok-Topk words received/step, mean [busiest rank] | 6k(P-1)/P | busiest / bound | "
          "mean / 2k(P-1)/P | TopkA / Ok-Topk | dense / Ok-Topk |")
    print("|---|---|---|---|---|---|---|---|")
    for P in args.procs:
        ok = load(args.results / f"comm_volume_oktopk_P{P}.json")["oktopk"]
        base = load(args.results / f"comm_volume_P{P}.json")
        k = ok["k"]
        lower, upper = 2 * k * (P - 1) / P, 6 * k * (P - 1) / P
        mean, busiest = ok["bytes_recv_mean"] / WORD, ok["bytes_recv_max"] / WORD
        print(f"| {P} | {ok['steps']} | {mean:,.0f} [{busiest:,.0f}] | {upper:,.0f} | {busiest / upper:.3f} | "
              f"{mean / lower:.2f} | {base['topka']['bytes_recv_mean'] / ok['bytes_recv_mean']:.2f} | "
              f"{base['dense']['bytes_recv_mean'] / ok['bytes_recv_mean']:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
