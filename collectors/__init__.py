"""perfscope.collectors: run or wrap the profilers (torch.profiler, nsys, ncu, NVML, NVTX) and
hand raw captures to analysis. Collectors import only perfscope's core.
"""
