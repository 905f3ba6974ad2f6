"""Sessions: run a workload under collectors (the engine, a script, a load test), analyse
the capture and return a Report.
"""
