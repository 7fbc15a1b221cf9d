#!/usr/bin/env python3
"""check_test_registry.py — every ctest entry of a Catch2 executable runs exactly one
test case, and every test case has its entry.

catch_discover_tests turns each name Catch2 lists into a ctest entry whose argument is
the name itself; a name CMake splits (at ';') or Catch2's spec syntax reads otherwise
makes entries that match no case, which Catch2 v2 reports as a pass ("No tests ran")
unless run with --warn NoTests. This check makes such drift visible at once.

usage: check_test_registry.py CTEST BUILD_DIR EXE[::SPEC] ...
"""
import json
import subprocess
import sys


def catch_names(exe, filters):
    """Test case names `exe` lists for `filters` (Catch2's own matching)."""
    res = subprocess.run([exe, *filters, "--list-test-names-only"], capture_output=True, text=True)
    if res.returncode < 0:
        sys.exit(f"{exe}: listing its tests crashed (signal {-res.returncode})")
    return [line for line in res.stdout.splitlines() if line.strip()]


def unescape(arg):
    """catch_discover_tests escapes ',', '[' and ']' in the names it passes."""
    for ch in ",[]":
        arg = arg.replace("\\" + ch, ch)
    return arg


def main():
    ctest, build_dir, *targets = sys.argv[1:]
    shown = subprocess.run([ctest, "--test-dir", build_dir, "--show-only=json-v1"],
                           capture_output=True, text=True, check=True)
    entries = {}  # exe → names its ctest entries pass
    for test in json.loads(shown.stdout)["tests"]:
        cmd = test.get("command") or []
        if len(cmd) >= 2:
            entries.setdefault(cmd[0], []).append(cmd[1])
    problems = []
    total_cases = total_entries = 0
    for target in targets:
        exe, _, spec = target.partition("::")
        listed = catch_names(exe, [spec] if spec else [])
        mine = entries.get(exe, [])
        total_cases += len(listed)
        total_entries += len(mine)
        names = [unescape(a) for a in mine]
        for name in names:
            if name not in listed:
                problems.append(f"{exe}: ctest entry '{name}' is not a test case name (Catch2 lists none by it)")
        for name in listed:
            if names.count(name) != 1:
                problems.append(f"{exe}: test case '{name}' has {names.count(name)} ctest entries, expected 1")
        # Catch2's own reading of the arguments ctest passes: together they select every case.
        # Catch2 ORs the patterns of one argument joined by ',' (separate arguments AND).
        selected = catch_names(exe, [",".join(mine)]) if mine else []
        if len(selected) != len(listed):
            problems.append(f"{exe}: its ctest entries' arguments select {len(selected)} "
                            f"of its {len(listed)} test cases")
    for p in problems:
        print(p)
    print(f"{len(targets)} Catch2 executables: {total_cases} test cases, {total_entries} ctest entries")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
