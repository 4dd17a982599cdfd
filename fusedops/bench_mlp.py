"""python -m fusedops.bench_mlp: entry point of fusedops.tools.bench_mlp."""

from fusedops.tools.bench_mlp import main

if __name__ == "__main__":
    main()
