"""What users run, apart from the library: benchmarks, the profiler kit, the demo and its report.

Each module has a main(); `python -m fusedops.<name>` (bench, bench_mlp, compare, profile, demo)
runs it.
"""
