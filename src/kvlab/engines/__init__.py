"""Engines: one module per engine holds all its knowledge (`vllm`, `llamacpp`); `plan` is the
shared data shape, `process` runs any plan, `install` puts the CPU engines on a machine."""
