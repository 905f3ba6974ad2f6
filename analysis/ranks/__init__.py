"""Ranks: the per-rank statistics of a distributed job, how its files make one job, the
parallel import on Dask and partial reads of a multi-rank report.
"""
