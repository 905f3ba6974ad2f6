"""Readers: a profiler output in, an analysed Report out. One subpackage or module per format
(kineto, nsys, ncu, nvml), format detection (:mod:`.detect`) and the one finishing
step every reader ends with (:mod:`.finish`).
"""
