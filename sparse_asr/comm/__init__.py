from sparse_asr.comm.communicator import CommCounts, Communicator

__all__ = ["CommCounts", "Communicator"]
