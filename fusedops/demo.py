"""python -m fusedops.demo: entry point of fusedops.tools.demo."""

from fusedops.tools.demo import main

if __name__ == "__main__":
    main()
