from sparse_asr.comm.communicator import CommCounts, Communicator
from sparse_asr.comm.threads import ThreadGroup

__all__ = ["CommCounts", "Communicator", "ThreadGroup"]
