"""Planning against a memory budget: fit.py (the largest batch or dim that fits, check, sharding, what-ifs, the GPU
catalogue and the runtimes' fixed costs) and family.py (one wiring sized at many dims without re-running
inference)."""
