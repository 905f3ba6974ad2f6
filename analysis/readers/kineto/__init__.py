"""PyTorch profiler (Kineto) chrome traces: the events file, the parse, the CPU ops and
the kernels replayed by CUDA graphs.
"""
