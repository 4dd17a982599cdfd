"""python -m fusedops: print what this build holds."""

import json

import fusedops

print(json.dumps(fusedops.build_info(), indent=2))
