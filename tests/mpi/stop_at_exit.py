"""Under mpiexec: train.py's or evaluate.py's main with rank 1 stopping itself (SIGSTOP) at one point, as a node
that stalls would. The job must end within distributed.timeout_s (--timeout-s) and a few seconds, naming what
waited, instead of hanging.

    mpiexec -n 2 python -m tests.mpi.stop_at_exit train-done ARGS...       after rank 0 printed done:
    mpiexec -n 2 python -m tests.mpi.stop_at_exit evaluate-startup ARGS... before MPI is up (MPI_Init)
    mpiexec -n 2 python -m tests.mpi.stop_at_exit evaluate-scoring ARGS... while scoring the manifest

Prints 'STOPPING <unix time>' to stderr just before the stop, so the test can time the shutdown.
"""
import os
import signal
import sys
import time


def stop(rank) -> None:
    if str(rank) == "1":
        print(f"STOPPING {time.time()}", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)


if __name__ == "__main__":
    when, args = sys.argv[1], sys.argv[2:]
    if when == "train-done":
        import train
        from sparse_asr.training import launch

        original = launch.run_job

        def run_job(comm, request):
            results = original(comm, request)
            comm.barrier()  # rank 0 has printed done:
            stop(comm.rank)
            return results

        launch.run_job = run_job
        train.main(args)
    else:
        import evaluate

        if when == "evaluate-startup":
            stop(os.environ.get("PMI_RANK"))  # hydra's rank variable: MPI is not up yet
        else:
            original = evaluate.check_inputs

            def check_inputs(comm, paths, training):
                stop(comm.rank)
                return original(comm, paths, training)

            evaluate.check_inputs = check_inputs
        evaluate.main(args)
    print("rank finished normally (it should not)", flush=True)
