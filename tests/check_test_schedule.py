#!/usr/bin/env python3
"""Checks the test schedule ctest reads: every name given to tpscope_waiting_tests (tests/CMakeLists.txt) names a test
that carries the label `waits` and may run beside others. A renamed test would otherwise quietly run alone again."""
import argparse
import json
import subprocess
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ctest", default="ctest", help="the ctest to ask (the build's own)")
    ap.add_argument("--build", required=True, help="the build folder ctest reads")
    ap.add_argument("--expect", type=int, required=True, help="how many names tpscope_waiting_tests was given")
    a = ap.parse_args()
    out = subprocess.run([a.ctest, "--test-dir", a.build, "--show-only=json-v1"], check=True, capture_output=True,
                         text=True).stdout
    waiting = []
    for test in json.loads(out)["tests"]:
        props = {p["name"]: p["value"] for p in test.get("properties", [])}
        if "waits" in props.get("LABELS", []):
            waiting.append(test["name"])
            if props.get("RUN_SERIAL"):
                print(f"check_test_schedule: {test['name']} is labelled 'waits' but still runs alone", file=sys.stderr)
                return 1
    if len(waiting) != a.expect:
        print(f"check_test_schedule: {a.expect} names were given to tpscope_waiting_tests but {len(waiting)} tests "
              f"carry the label 'waits' ({', '.join(sorted(waiting)) or 'none'}): a listed test was renamed or removed",
              file=sys.stderr)
        return 1
    print(f"check_test_schedule: {len(waiting)} waiting tests, each may run beside others")
    return 0


if __name__ == "__main__":
    sys.exit(main())
