#!/usr/bin/env python
"""Compare the BAND lines of two runs of the same benchmark (two saved outputs).

    python benchmarks/compare_bands.py RUN1.txt RUN2.txt [--markdown]

For each headline ratio (a ``BAND {json}`` line, written by ``_common.band``) it prints
the ratio of run 1 and of run 2, the promised band, whether run 2's ratio lies within
+-band of run 1's, and whether each run's own rounds stayed inside the band. Exit
status 1 when any pair is outside its band (or a ratio is missing from one run).
"""

from __future__ import annotations

import argparse
import json
import sys


def bands(path: str) -> dict[str, dict]:
    """{label: BAND payload} of one saved output."""
    found = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("BAND {"):
                payload = json.loads(line[len("BAND ") :])
                found[payload["label"]] = payload
    return found


def fmt(value) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def yes_no(flag) -> str:
    return "n/a" if flag is None else "yes" if flag else "no"


def compare(first: dict, second: dict) -> list[dict]:
    rows = []
    for label in list(first) + [lb for lb in second if lb not in first]:
        a, b = first.get(label, {}), second.get(label, {})
        promised = a.get("band", b.get("band"))
        r1, r2 = a.get("ratio"), b.get("ratio")
        between = r1 is not None and r2 is not None and abs(r2 / r1 - 1.0) <= promised
        rows.append(
            {
                "label": label,
                "run1": r1,
                "run2": r2,
                "band": promised,
                "between": between,
                "within": (a.get("inside"), b.get("inside")),
                "not_a_floor": bool(a.get("not_a_floor") or b.get("not_a_floor")),
            }
        )
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run1")
    p.add_argument("run2")
    p.add_argument("--markdown", action="store_true", help="print table rows in Markdown")
    args = p.parse_args(argv)
    rows = compare(bands(args.run1), bands(args.run2))
    if not rows:
        print(f"no BAND lines in {args.run1} or {args.run2}: nothing to compare")
        return 1
    for row in rows:
        note = " (a floor was slower than what it bounds in one run)" if row["not_a_floor"] else ""
        cells = [
            row["label"],
            fmt(row["run1"]),
            fmt(row["run2"]),
            f"+-{row['band']:.0%}",
            yes_no(row["between"]),
            f"{yes_no(row['within'][0])}/{yes_no(row['within'][1])}{note}",
        ]
        print(
            "| " + " | ".join(cells) + " |"
            if args.markdown
            else f"{cells[0]}: run 1 {cells[1]}, run 2 {cells[2]}, band {cells[3]}, "
            f"run 2 within band of run 1: {cells[4]}; rounds inside (run 1/run 2): {cells[5]}"
        )
    return 0 if all(r["between"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
