"""Train a speech model with (sparse) data-parallel gradient exchange.

    python train.py --config configs/an4_cpu.yaml [key.sub=value ...]
    mpiexec -n 4 python train.py --config configs/an4_cpu.yaml compression.algorithm=oktopk compression.density=0.02
    python train.py --resume runs/NAME [train.epochs=40 ...]         (its own config; safe keys may change)
    python train.py --config configs/an4_cpu.yaml name=NAME --resume auto     (chained batch jobs)

The job is sparse_asr.training.launch.run_job: the request (the configuration parsed once, here) -> under the
run directory's lock one plan (fresh or resumed, config resolved, data and checkpoint checked: everything that
can refuse the run, before anything is written) -> start_run (model, exchange, restored state) -> Trainer.fit().
Any exception on any rank ends the whole job.
"""
import os
import signal

# Ctrl-C while torch and MPI are still importing: end at once, quietly (a KeyboardInterrupt inside those
# imports left a traceback and a segmentation fault). From main() on, Ctrl-C ends every rank in order.
signal.signal(signal.SIGINT, lambda *_: os._exit(130))

import argparse  # noqa: E402
import sys  # noqa: E402

from sparse_asr.comm import Communicator  # noqa: E402
from sparse_asr.training.runtime import StartupGuard, end_job, run_or_abort  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML experiment config (see configs/); optional with --resume RUN_DIR")
    parser.add_argument("--resume", default="", help="run directory or checkpoint directory to continue (its own "
                        "config; same as train.resume=PATH); 'auto': continue the named run if it has a "
                        "checkpoint, else start it")
    parser.add_argument("--overwrite", action="store_true",
                        help="start afresh in a run directory that holds a previous run: its config.yaml, "
                             "metrics.jsonl, TensorBoard events and checkpoints/ are deleted first (with "
                             "--resume auto: only when there is no checkpoint to continue)")
    parser.add_argument("overrides", nargs="*", metavar="key.sub=value", help="config overrides")
    return parser.parse_intermixed_args(argv)  # overrides may come before and after the flags


def main(argv=None) -> int:
    args = parse_args(argv)
    from sparse_asr.training.plan import read_request  # (imports torch: after the argument check)

    try:  # the configuration, parsed and validated once, before MPI is up: it holds the start-up guard's timeout
        request, problem = read_request(args.config, args.overrides, args.resume, args.overwrite), None
    except Exception as e:  # noqa: BLE001 -- a ConfigError above all: reported once MPI is up, as every error is
        request, problem = None, e
    guard = StartupGuard(request.timeout_s if request else 0.0)  # a rank stalled before MPI is up must not hang
    comm = Communicator()
    guard.disarm()
    from sparse_asr.training.launch import run_job  # heavy imports after the argument check: errors are instant

    signal.signal(signal.SIGINT, signal.default_int_handler)  # KeyboardInterrupt: run_or_abort ends the job
    if problem is not None:
        run_or_abort(comm, raise_, problem)
    run_or_abort(comm, run_job, comm, request)
    # a resumed run's own timeout is in the config.yaml it has just written (request.timeout_s reads it)
    end_job(comm, request.timeout_s)  # watched until MPI_Finalize: a rank gone now must not hang the job
    return 0


def raise_(error: Exception):
    raise error


if __name__ == "__main__":
    sys.exit(main())
