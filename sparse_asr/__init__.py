"""Data-parallel training of an LSTM speech recognizer (lstman4) on AN4 with sparse gradient allreduce.

Subpackages: comm (MPI Communicator), compression (dense, Ok-Topk and the sparse baselines),
data (AN4, manifests, audio, features), models (DeepSpeech2-style lstman4), training (config, loop).
"""
