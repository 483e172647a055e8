"""What the machine is and what it can do: sysinfo (the fingerprint every row carries), cpuinfo
(the one /proc/cpuinfo and CPU-list parser), probes (same-process read bandwidth and compute peak),
perf (DRAM counters, with per-microarchitecture tables in perf_events/)."""
