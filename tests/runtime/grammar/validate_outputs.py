#!/usr/bin/env python3
"""The oracle of structured-output tests: reads JSON lines {"schema": S, "text": T} on stdin; each T must parse as
JSON and validate against S with the python3-jsonschema validator (Draft 2020-12 unless S names another).
Prints one line per failure and "validated N outputs, F failed"; exit status 1 when any failed, 77 (skip) when the
jsonschema module is missing."""
import json
import sys

try:
    import jsonschema
except ImportError:
    print("validate_outputs: python3-jsonschema is not installed (tools/setup.sh installs it)")
    sys.exit(77)

total = failed = 0
for line in sys.stdin:
    if not line.strip():
        continue
    case = json.loads(line)
    total += 1
    try:
        instance = json.loads(case["text"])
        cls = jsonschema.validators.validator_for(case["schema"], default=jsonschema.Draft202012Validator)
        cls(case["schema"]).validate(instance)
    except Exception as e:  # any parse or validation error is a failure
        failed += 1
        print(f"INVALID: {case['text']!r} against {json.dumps(case['schema'])}: {type(e).__name__}: "
              f"{str(e).splitlines()[0]}")
print(f"validated {total} outputs, {failed} failed")
sys.exit(1 if failed or total == 0 else 0)
