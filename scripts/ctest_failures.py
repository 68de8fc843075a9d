#!/usr/bin/env python3
"""Prints the end of each failed test's output from a build folder's last ctest run.

scripts/test.sh calls it after its summary, so that the lines that say why a test failed are
at the end of the log, where a CI page that keeps only the head and the tail shows them
(ctest --output-on-failure prints them in the middle, where they are cut).

Usage: scripts/ctest_failures.py BUILD_DIR [--lines N] [--max-tests N]
"""
import argparse
import pathlib
import re
import sys


def failed_names(temporary):
    path = temporary / "LastTestsFailed.log"
    if not path.exists():
        return []
    names = []
    for line in path.read_text(errors="replace").splitlines():
        _, _, name = line.partition(":")
        if name:
            names.append(name)
    return names


def outputs(temporary):
    """Test name -> the output of its last run in LastTest.log."""
    path = temporary / "LastTest.log"
    if not path.exists():
        return {}
    text = path.read_text(errors="replace")
    found = {}
    # Each test: 'N/M Test: NAME', ..., 'Output:', a rule, the output, '<end of output>'.
    pattern = re.compile(r"^\d+/\d+ Test: (.+?)\n.*?^Output:\n-+\n(.*?)<end of output>",
                         re.S | re.M)
    for match in pattern.finditer(text):
        found[match.group(1)] = match.group(2)
    return found


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build_dir")
    parser.add_argument("--lines", type=int, default=30)
    parser.add_argument("--max-tests", type=int, default=3)
    args = parser.parse_args()
    temporary = pathlib.Path(args.build_dir) / "Testing" / "Temporary"
    names = failed_names(temporary)
    if not names:
        return 0
    texts = outputs(temporary)
    print(f"[failures] {args.build_dir}: {len(names)} failed: {' '.join(names[:20])}")
    for name in names[:args.max_tests]:
        lines = texts.get(name, "(no output recorded)\n").rstrip("\n").splitlines()
        print(f"[failures] ---- {name}: its last {min(len(lines), args.lines)} lines")
        for line in lines[-args.lines:]:
            print(f"  {line[:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
