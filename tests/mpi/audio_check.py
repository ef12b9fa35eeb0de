"""Under mpiexec: the audio check before training shares the rows among the ranks (disjoint shares that
cover every row once) and every rank raises: rank 0 naming each bad manifest line, the others pointing
to rank 0.

    mpiexec -n P python -m tests.mpi.audio_check TRAIN_MANIFEST TEST_MANIFEST EXPECTED_FIRST_LINE
"""
import sys

from sparse_asr.comm import Communicator
from sparse_asr.data.audio import AudioError
from sparse_asr.data.manifest import read_manifest
from sparse_asr.training import runtime
from sparse_asr.training.runtime import check_manifest_audio, run_or_abort


def main(comm, train_manifest, test_manifest, expected_first_line):
    checked = []
    original = runtime.audio_problem
    runtime.audio_problem = lambda audio, duration, rate: checked.append(audio) or original(audio, duration, rate)
    frames = [read_manifest(train_manifest), read_manifest(test_manifest)]
    try:
        check_manifest_audio(comm, frames)
    except AudioError as e:
        message = str(e)
    else:
        raise AssertionError(f"rank {comm.rank}: no AudioError")
    shares = comm.allgather_object(checked)
    every = sorted(a for share in shares for a in share)
    expected = sorted(a for df in frames for a in df["audio"])
    assert every == expected, "the shares do not cover every row exactly once"
    assert all(abs(len(share) - len(expected) / comm.size) < 1 for share in shares), [len(s) for s in shares]
    if comm.rank == 0:
        assert message.splitlines()[0] == expected_first_line, message
        print(message, flush=True)
    else:
        assert message == expected_first_line.replace(" (checked before training):", ": rank 0 lists them"), message
    comm.barrier()
    if comm.rank == 0:
        print(f"P={comm.size}: shares {[len(s) for s in shares]}", flush=True)


if __name__ == "__main__":
    comm = Communicator()
    run_or_abort(comm, main, comm, *sys.argv[1:4])
