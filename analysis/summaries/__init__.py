"""Summaries: tables computed from a finished Report (kernels, serving, compare, sweep,
load test). They read a Report and never parse a file.
"""
