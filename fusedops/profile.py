"""The profiling kit (fusedops.tools.profile); python -m fusedops.profile runs its main."""

from fusedops.tools.profile import Profile, amdahl, labelled, main, parse_trace, profile, table

__all__ = ["Profile", "amdahl", "labelled", "parse_trace", "profile", "table"]

if __name__ == "__main__":
    main()
