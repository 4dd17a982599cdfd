"""python -m fusedops.bench: entry point of fusedops.tools.bench."""

from fusedops.tools.bench import main

if __name__ == "__main__":
    main()
