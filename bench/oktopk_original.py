"""The original Ok-Topk exchange (Shigang Li's code for Li & Hoefler, PPoPP 2022) beside this repository's, on the
same gradients in one job.

    git clone https://github.com/Shigangli/Ok-Topk /path/to/Ok-Topk
    OMP_NUM_THREADS=1 mpiexec -n P .venv/bin/python bench/oktopk_original.py --original /path/to/Ok-Topk \
        [--n 27569568] [--density 0.02] [--steps 64] [--warmup 4] [--seed 0]

The original is not part of this repository: it is imported at run time from DIR/LSTM (allreducer.py, compression.py,
settings.py, utils.py; DIR may also be that LSTM directory itself) and left as it is. Its own AllReducer runs in its
own thread, driven as its distributed_optimizer.py drives it: one parameter of n entries, the gradient handed over
with add_tensor and the parameter's name put on its message queue, the averaged update read with get_result once it
reports DONE; compressor 'oktopk' of its compression.py, sparse, at --density (its LSTM runs use 0.02). Ours is
sparse_asr.compression.oktopk.OkTopk with its default options, run by its `step` on the flat gradient.

Both take the gradient and leave the averaged sparse update in its place, error feedback included (the residual
added, the applied entries cleared): that is one exchange, timed on each rank from the hand-over to the update, the
slowest rank's time taken per step. Every step feeds both the same gradient (sparse_asr.compression.synthetic's
generator: heavy-tailed, seeded by step and rank), a copy each, after a barrier, alternating which goes first so a
busy machine slows both alike. The floor is one `d += b` over n float32 (one pass over memory), timed in the same
steps. Steps 0 .. warmup-1 (4 by default) run untimed: step 0 is both implementations' exact step (thresholds by a
top-k over n, regions repartitioned) and the next ones are cold. After that both still recompute their thresholds
exactly every 32 steps and repartition every 64 (ours also on steps 4, 8 and 16, while its regions settle), as in
training; the medians are over all timed steps.

Where the original cannot run here as it is, the bench adapts its surroundings, never its algorithm:
  - its run() averages densely while its step counter is below 128 (a training warm-up that touches no Ok-Topk
    state); the counter is set to 128 before the first step, so every step here is an Ok-Topk one;
  - it was written for GPUs: on a machine without CUDA, `.cuda(new_tensor.device)` (new_tensor on the CPU) is made
    to mean what it does on a GPU, the gradient's own device, and torch.cuda.synchronize() to do nothing;
  - its utils.py and compression.py import scipy.stats, which the Ok-Topk branch never calls; without scipy
    installed a stub stands in for it (any use of it raises);
  - its communicator is wrapped to count the bytes each MPI call brings to the rank, by the conventions of
    sparse_asr.comm (an allreduce as a ring, 2(P-1)/P of the buffer; an allgather(v) or alltoall the other ranks'
    parts; a receive its buffer), and the counts its alltoall announces (its local selection).

The first table: P, n, the median ms per exchange of the original and of ours (the slowest rank's each step), their
ratio, the floor and each as a multiple of it. The second, per implementation: words (4 bytes) received per rank
and step, mean over the timed steps [busiest rank], also over 2k(P-1)/P (the reduce's lower bound); the local and
global selected counts over k (means); and whether the update was the same on every rank at every timed step.
"""
import argparse
import contextlib
import io
import logging
import os
import queue
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import torch

from side_by_side import median_ms, run_side_by_side, slowest
from sparse_asr.comm import Communicator
from sparse_asr.compression.oktopk import OkTopk
from sparse_asr.compression.synthetic import GradientSource
from sparse_asr.training.launch import setup_process

WORD = 4
NAME = "flat"  # the one parameter the original's AllReducer is given
DENSE_STEPS = 128  # the original's run() averages densely while its counter is below this (allreducer.py)


def lstm_dir(original: Path) -> Path:
    """The original's LSTM directory: DIR/LSTM, or DIR itself if it holds allreducer.py."""
    for candidate in (original / "LSTM", original):
        if (candidate / "allreducer.py").is_file():
            return candidate
    raise SystemExit(f"oktopk_original: no LSTM/allreducer.py under {original} (a checkout of "
                     f"https://github.com/Shigangli/Ok-Topk, or its LSTM directory)")


def stub_scipy() -> None:
    """The original's utils.py and compression.py import scipy.stats for helpers of other compressors; stand in
    for it when scipy is absent, so that any use of it fails loudly instead of computing something else."""
    def missing(name):
        raise AttributeError(f"scipy.stats.{name}: scipy is not installed here (bench/oktopk_original.py stubs it)")

    scipy, stats = types.ModuleType("scipy"), types.ModuleType("scipy.stats")
    stats.__getattr__ = missing
    scipy.stats = stats
    sys.modules["scipy"], sys.modules["scipy.stats"] = scipy, stats


def run_gpu_code_on_cpu() -> None:
    """The original moves received buffers with `.cuda(new_tensor.device)` and calls torch.cuda.synchronize(), as
    it only ran on GPUs. Without CUDA, a `.cuda(device)` to a CPU device returns the tensor where it is (what it
    does on a GPU: to the gradient's device) and synchronize does nothing (there is nothing to wait for)."""
    if torch.cuda.is_available():
        return
    cuda = torch.Tensor.cuda

    def to_device(self, device=None, non_blocking=False, **kwargs):
        if device is not None and torch.device(device).type == "cpu":
            return self
        return cuda(self, device, non_blocking, **kwargs)

    torch.Tensor.cuda = to_device
    torch.cuda.synchronize = lambda device=None: None


def git_head(path: Path) -> str:
    """The checkout's commit, or 'unknown' (a copy without its git directory)."""
    head = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return head.stdout.strip() if head.returncode == 0 else "unknown"


class CountingComm:
    """MPI.COMM_WORLD for the original's calls, counting the bytes each brings to this rank (the module docstring's
    conventions) and the local selection's size, the sum of the counts its alltoall announces."""

    def __init__(self, comm):
        self._comm = comm
        self.bytes_recv = 0
        self.announced = 0

    def __getattr__(self, name):
        return getattr(self._comm, name)

    def _others(self, nbytes: int) -> int:
        return nbytes * (self._comm.size - 1) // self._comm.size

    def Irecv(self, buf, *args, **kwargs):
        self.bytes_recv += buf[0].nbytes
        return self._comm.Irecv(buf, *args, **kwargs)

    def Alltoall(self, sendbuf, recvbuf):
        self.announced += int(sendbuf.sum())
        self.bytes_recv += self._others(recvbuf.nbytes)
        return self._comm.Alltoall(sendbuf, recvbuf)

    def Allgather(self, sendbuf, recvbuf):
        self.bytes_recv += recvbuf.nbytes - sendbuf.nbytes
        return self._comm.Allgather(sendbuf, recvbuf)

    def Allgatherv(self, sendbuf, recvbuf):
        self.bytes_recv += recvbuf[0].nbytes - sendbuf.nbytes
        return self._comm.Allgatherv(sendbuf, recvbuf)

    def Allreduce(self, sendbuf, recvbuf, op):
        self.bytes_recv += 2 * self._others(sendbuf.nbytes)
        return self._comm.Allreduce(sendbuf, recvbuf, op)


class Original:
    """The original's AllReducer in its thread, for one flat parameter of n entries (module docstring)."""

    def __init__(self, lstm: Path, n: int, density: float):
        sys.path.insert(0, str(lstm))  # it imports its siblings (settings, utils, compression) by their names
        try:
            import scipy  # noqa: F401
        except ImportError:
            stub_scipy()
        writes_bytecode, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # leave the checkout as it is
        import allreducer
        import compression
        import settings
        sys.dont_write_bytecode = writes_bytecode
        settings.logger.setLevel(logging.WARNING)  # its per-50-steps profile and start-up lines
        self.queue, self.done = queue.Queue(), queue.Queue()
        parameter = torch.nn.Parameter(torch.zeros(n))
        with contextlib.redirect_stdout(io.StringIO()):  # it prints the parameter count
            self.reducer = allreducer.AllReducer([(NAME, parameter)], threading.Lock(), threading.Lock(),
                                                 compression.compressors["oktopk"], sparse=True, density=density,
                                                 msg_queue=self.queue, msg_queue2=self.done)
        self.comm = self.reducer._comm = CountingComm(self.reducer._comm)
        self.reducer._allreduce_counter[NAME] = DENSE_STEPS
        self.thread = threading.Thread(name="allreducer", target=self.reducer.run, daemon=True)
        self.thread.start()

    def step(self, grad: torch.Tensor) -> torch.Tensor:
        """Hand `grad` over (it is consumed) and wait for the averaged sparse update."""
        self.reducer.add_tensor(NAME, grad)
        self.queue.put(NAME)
        while True:  # a wait that notices the thread dying (its traceback is printed), rather than a hang
            try:
                self.done.get(timeout=1.0)
                return self.reducer.get_result(NAME)
            except queue.Empty:
                if not self.thread.is_alive():
                    raise SystemExit("oktopk_original: the original's AllReducer thread stopped (see above)")

    def stop(self) -> None:
        self.reducer.stop()
        self.queue.put("STOP")
        self.thread.join()


def same_everywhere(comm: Communicator, update: torch.Tensor) -> bool:
    """Whether every rank holds the same update (its sum and nonzero count, compared across ranks)."""
    mine = (float(update.double().sum()), int(torch.count_nonzero(update)))
    return len(set(comm.allgather_object(mine))) == 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--original", type=Path, required=True,
                        help="a checkout of https://github.com/Shigangli/Ok-Topk (or its LSTM directory)")
    parser.add_argument("--n", type=int, default=27569568, help="gradient entries")
    parser.add_argument("--density", type=float, default=0.02)
    parser.add_argument("--steps", type=int, default=64, help="timed steps")
    parser.add_argument("--warmup", type=int, default=4, help="untimed steps first (step 0 is the exact one)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 1 or args.n < 1 or not 0 < args.density <= 1:
        parser.error("--steps, --warmup and --n must be positive, --density in (0, 1]")
    lstm = lstm_dir(args.original.resolve())

    comm = Communicator()
    setup_process(comm, "cpu", threads=1)
    P, rank = comm.size, comm.rank
    if P < 2:
        raise SystemExit("oktopk_original: run it under mpiexec -n P with P >= 2 (an exchange needs peers)")
    run_gpu_code_on_cpu()
    original = Original(lstm, args.n, args.density)
    ours = OkTopk(comm, args.n, args.density)
    k = ours.k
    source = GradientSource(args.n, rank, args.seed)
    names = ("original", "ours")
    same = {name: True for name in names}

    # each returns its row: (seconds, bytes received, local selected, global selected)
    def run_original(flat, timed):
        recv0, announced0 = original.comm.bytes_recv, original.comm.announced
        t0 = time.perf_counter()
        update = original.step(flat)
        seconds = time.perf_counter() - t0
        if timed:
            same["original"] &= same_everywhere(comm, update)
        return (seconds, original.comm.bytes_recv - recv0, original.comm.announced - announced0,
                int(torch.count_nonzero(update)))

    def run_ours(flat, timed):
        with comm.measure() as moved:
            t0 = time.perf_counter()
            stats = ours.step(flat)
            seconds = time.perf_counter() - t0
        if timed:
            same["ours"] &= same_everywhere(comm, flat)
        return seconds, moved.bytes_recv, stats.selected_local, stats.selected_global

    run = run_side_by_side(comm, source, args.n, args.warmup, args.steps,
                           {"original": run_original, "ours": run_ours})
    original.stop()

    floor_ms = median_ms(slowest(comm, run.floor_s))
    results = {}
    for name in names:
        mine = np.array(run.rows[name], dtype=np.float64)  # steps x 4
        recv = comm.allgather_object(float(mine[:, 1].mean()))
        results[name] = {"ms": median_ms(slowest(comm, mine[:, 0])),
                         "words": float(np.mean(recv)) / WORD, "words_busiest": float(np.max(recv)) / WORD,
                         "local": float(np.mean(comm.allgather_object(float(mine[:, 2].mean())))) / k,
                         "global": float(mine[:, 3].mean()) / k}
    if rank != 0:
        return
    orig, our = results["original"], results["ours"]
    unit = 2 * k * (P - 1) / P
    lines = [
        f"Ok-Topk exchange, the original (Shigangli/Ok-Topk {git_head(lstm)}, LSTM/allreducer.py) vs ours: "
        f"density {args.density}, k = {k:,}, 1 thread per rank, steps {args.warmup}..{args.warmup + args.steps - 1} "
        f"timed (steps 0..{args.warmup - 1} untimed); ms: median over the timed steps of the slowest rank's; load "
        f"average (1, 5, 15 min) {' '.join(f'{x:.1f}' for x in run.load_before)} before, "
        f"{' '.join(f'{x:.1f}' for x in run.load_after)} after, on {os.cpu_count()} cores",
        "",
        "| P | n | original ms | ours ms | original / ours | floor ms (`d += b`) | original / floor | ours / floor |",
        "|---|---|---|---|---|---|---|---|",
        f"| {P} | {args.n:,} | {orig['ms']:.1f} | {our['ms']:.1f} | {orig['ms'] / our['ms']:.2f} | {floor_ms:.2f} "
        f"| {orig['ms'] / floor_ms:.1f}x | {our['ms'] / floor_ms:.1f}x |",
        "",
        "| impl | words received/step, mean [busiest] | / 2k(P-1)/P | local selected / k | global selected / k "
        "| same update on every rank |",
        "|---|---|---|---|---|---|",
    ]
    for name in names:
        r = results[name]
        lines.append(f"| {name} | {r['words']:,.0f} [{r['words_busiest']:,.0f}] | {r['words'] / unit:.2f} "
                     f"| {r['local']:.2f} | {r['global']:.2f} | {'yes' if same[name] else 'NO'} |")
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    main()
