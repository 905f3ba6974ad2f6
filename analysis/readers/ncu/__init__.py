"""Nsight Compute results: ``.ncu-rep`` and ``ncu --csv``, and their metrics."""
