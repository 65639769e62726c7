"""Orchestrated experiments: start engines, run a workload, collect evidence, write lines."""
