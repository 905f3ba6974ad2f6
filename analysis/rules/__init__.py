"""The rules behind :mod:`perfscope.analysis.findings`, one module per theme.

- ``timeline``: idle time and gaps, many short kernels, launch overhead, streams that do not overlap.
- ``transfers``: host-device copies that are exposed or come from pageable memory.
- ``kernels``: kernels far below their roof, FP32 matmuls where tensor cores apply, measured vs
  analytic FLOPs, occupancy and warp stalls (Nsight Compute reports).
- ``llm``: decode bandwidth utilisation (MBU), prefill MFU, KV-cache share of decode traffic,
  whether speculative decoding paid.

Every rule is a function ``Report -> list[Finding]`` registered in ``findings.RULES``.
"""
