"""Evidence read from outside the workload: engine /metrics, interface byte counters."""
