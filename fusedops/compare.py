"""python -m fusedops.compare: entry point of fusedops.tools.compare."""

from fusedops.tools.compare import main

if __name__ == "__main__":
    main()
