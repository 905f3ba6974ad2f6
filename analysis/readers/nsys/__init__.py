"""Nsight Systems exports: the SQLite export, its NVTX ranges, the reader."""
