"""AMD's own profilers: rocprofv3 (CSV, JSON, rocpd SQLite), rocprof v1/v2 and rocprof-compute workloads."""
