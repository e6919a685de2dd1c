#!/usr/bin/env python3
"""Copy the side-by-side table of bench/RESULTS.md into README.md.

bench/peers/run.sh writes RESULTS.md with the README's comparison table
between the lines "<!-- peers-table:begin -->" and "<!-- peers-table:end -->";
this script replaces the lines between the same markers in README.md with it,
so that every peer figure in the README comes from one measured run. It
changes nothing else, and fails (exit status 1, README.md untouched) when
either file lacks the markers or has them out of order.

    python3 bench/peers/readme_tables.py [--results bench/RESULTS.md] [--readme README.md] [--check]

--check exits 1 if README.md's table differs from RESULTS.md's, writing
nothing.
"""

import argparse
import os
import sys

BEGIN = "<!-- peers-table:begin -->"
END = "<!-- peers-table:end -->"
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def block(text, name):
    """Returns (start, end) offsets of the marked block of text, markers
    included; raises ValueError naming the file when it has none."""
    i = text.find(BEGIN)
    j = text.find(END)
    if i < 0 or j < 0 or j < i or text.find(BEGIN, i + 1) >= 0:
        raise ValueError("%s: want exactly one %s ... %s block" % (name, BEGIN, END))
    return i, j + len(END)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--results", default=os.path.join(ROOT, "bench", "RESULTS.md"))
    ap.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    ap.add_argument("--check", action="store_true", help="only report whether README.md is up to date")
    a = ap.parse_args()
    try:
        with open(a.results) as f:
            res = f.read()
        with open(a.readme) as f:
            readme = f.read()
        i, j = block(res, a.results)
        k, l = block(readme, a.readme)
    except (OSError, ValueError) as e:
        print("readme_tables:", e, file=sys.stderr)
        return 1
    new = readme[:k] + res[i:j] + readme[l:]
    if a.check:
        if new != readme:
            print("readme_tables: %s differs from %s" % (a.readme, a.results), file=sys.stderr)
            return 1
        return 0
    if new != readme:
        with open(a.readme, "w") as f:
            f.write(new)
        print("readme_tables: %s updated from %s" % (a.readme, a.results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
