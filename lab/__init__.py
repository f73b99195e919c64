"""The lab: every rung of the kernel ladder that the engine does not run, with its benchmarks.

The engine (andrea_numba) never imports the lab; the lab imports the engine, and the agreement
harness checks its rungs against the same twin.
"""
