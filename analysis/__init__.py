"""perfscope.analysis: readers that turn profiler outputs into Report tables, and small pure
DataFrame steps over them (costs, roofline classification, serving metrics, findings).

Analysis never imports collectors, dashboard or plotting.
"""
