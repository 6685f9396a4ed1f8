"""The report side of the benchmark scripts: spreads of runs, machine-readable lines,
and the bands (how far a headline ratio may move between two runs) with the RATIO and
floor summaries built on them. Imported by ``_common``, which re-exports every name:
scripts call ``C.band``, ``C.spread`` and so on. Imports nothing of ``_common``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time


def spread(values) -> str:
    values = list(values)
    if not values:
        return "n/a"
    return (
        f"best {min(values):.3f} s, median {statistics.median(values):.3f} s, "
        f"worst {max(values):.3f} s over {len(values)} runs"
    )


def runs_line(values) -> str:
    return "[" + ", ".join(f"{v:.3f}" for v in values) + "]"


def emit_json(tag: str, payload: dict) -> None:
    """One machine-readable line, e.g. for collecting results from run_all.sh logs."""
    print(f"{tag} {json.dumps(payload, sort_keys=True)}")
    sys.stdout.flush()


def add_band_arg(parser: argparse.ArgumentParser, band: float, why: str) -> None:
    """``band``: the script's promised relative spread of its headline ratio between
    two runs (0.15: +-15%); ``why``: what sets it (stated in --help)."""
    parser.add_argument(
        "--band",
        type=float,
        default=band,
        help=f"promised relative spread of the headline ratio between two "
        f"runs (default {band:g}, i.e. +-{band * 100:.0f}%%: {why})",
    )


def alternate(contenders: dict, repeat: int) -> dict[str, list[float]]:
    """{name: seconds of each of ``repeat`` rounds}: one untimed call of every contender
    first (all warmed up alike), then rounds in which the contenders take turns (a change
    of the machine's load hits them all, and each round is a pair for :func:`band`)."""
    for fn in contenders.values():
        fn()
    runs = {name: [] for name in contenders}
    for _ in range(repeat):
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            fn()
            runs[name].append(time.perf_counter() - t0)
    return runs


def round_ratios(numerators, denominators) -> list[float]:
    """Ratio of each round's pair (rounds in which either side is missing are left out)."""
    # strict=False: a contender that stopped early has fewer rounds; the pairs it has count
    return [a / b for a, b in zip(numerators, denominators, strict=False) if a and b]


def band(
    label: str,
    numerators,
    denominators,
    promised: float,
    *,
    names: tuple[str, str] = ("reference", "slem-dask"),
    floor: bool = False,
    shortest: float = 0.0,
) -> dict:
    """Print, and emit as a ``BAND {json}`` line, the headline ratio
    ``min(numerators) / min(denominators)`` (best against best), the per-round ratios'
    min / median / max and whether the run is inside its band (see above).

    ``floor=True``: the numerators are a floor's times, which bound the denominators'
    from below: the floor's best is the min over its runs; if that is still slower than
    the contender's best, the floor was not a floor in this run, and the line says so
    instead of giving a ratio (a floor / slem-dask ratio above 1 is no result).

    ``shortest``: seconds the best run of each side must take for the ratio to be banded;
    a shorter one moves by more than any band between runs, so the line says so and no
    ``BAND`` line is printed."""
    numerators, denominators = [float(v) for v in numerators], [float(v) for v in denominators]
    rounds = round_ratios(numerators, denominators)
    out = {
        "label": label,
        "numerator": names[0],
        "denominator": names[1],
        "band": promised,
        "floor": floor,
        "rounds": len(rounds),
    }
    quickest = min(numerators + denominators, default=0.0)
    if rounds and quickest < shortest:
        print(
            f"{label}: no BAND line: a best run of {quickest:.3f} s is shorter than "
            f"{shortest:g} s, too short to time steadily"
        )
        out.update(ratio=None, inside=None)
        return out
    if not rounds:
        print(f"BAND {label}: no complete round of {names[0]} and {names[1]}: no ratio")
        out.update(ratio=None, inside=False)
        emit_json("BAND", out)
        return out
    best_num, best_den = min(numerators), min(denominators)
    ratio = best_num / best_den
    mid = statistics.median(rounds)
    lo, hi = min(rounds), max(rounds)
    spread_ = max(hi / mid - 1.0, 1.0 - lo / mid)
    outside = sum(abs(r / mid - 1.0) > promised for r in rounds)
    # one round says nothing about the spread: the band is then checked between runs only
    inside = (
        abs(ratio / mid - 1.0) <= promised and outside <= len(rounds) // 5
        if len(rounds) > 1
        else None
    )
    out.update(
        ratio=ratio,
        round_min=lo,
        round_median=mid,
        round_max=hi,
        spread=spread_,
        rounds_outside=outside,
        inside=inside,
    )
    verdict = (
        "inside"
        if inside
        else "OUTSIDE (repeat more, or the machine is busy)"
        if inside is not None
        else "one round: checked only between two runs (compare_bands.py)"
    )
    if floor and best_num > best_den:
        out.update(ratio=None, not_a_floor=True, floor_best=best_num, contender_best=best_den)
        print(
            f"BAND {label}: floor slower than {names[1]}: not a floor in this run "
            f"(floor best {best_num:.3f} s over {len(numerators)} runs > {names[1]} best "
            f"{best_den:.3f} s); no ratio"
        )
    else:
        print(
            f"BAND {label}: {names[0]} / {names[1]} = {ratio:.3f} (best / best); per round "
            f"min {lo:.3f}, median {mid:.3f}, max {hi:.3f} over {len(rounds)} rounds: "
            f"{outside} outside +-{promised:.0%} of the median ({len(rounds) // 5} allowed: "
            f"one in five rounds): "
            f"{verdict}"
        )
    emit_json("BAND", out)
    return out


# -- summaries of bench_fit and bench_encode: a contender against slem-dask -----------

#: What a contender is called in a summary's RATIO line and its BAND line.
CONTENDER_NAMES = {"numpy": "numpy", "naive": "naive Dask"}


def ratio_summary(result, bench, label, contender, times, totals, args, *, key=None, goal=None):
    """The ``RATIO`` line of ``contender``'s ``times`` over slem-dask's ``totals`` on
    ``label`` (best against best, of ``args.repeat`` runs; medians), kept in ``result``
    as ``{key}_ratio_{contender}_best`` and ``_median`` (``key``: the label), then its
    BAND line (:func:`band` with ``args.band``); returns what :func:`band` returns."""
    name, med = CONTENDER_NAMES[contender], statistics.median
    best, median = min(times) / min(totals), med(times) / med(totals)
    print(
        f"[{label}] RATIO {contender}_time / slem_time = {best:.3f} (best of {args.repeat}); "
        f"{median:.3f} (medians)" + (f"  [{goal}]" if goal else "")
    )
    key = label if key is None else key
    result.update(
        {f"{key}_ratio_{contender}_best": best, f"{key}_ratio_{contender}_median": median}
    )
    return band(
        f"{bench} [{label}] {name} / slem-dask", times, totals, args.band, names=(name, "slem-dask")
    )


def floor_summary(result, bench, sched, heading, times, totals, args) -> None:
    """The floor's times against slem-dask's ``totals`` on ``sched``: ``heading`` names
    what the floor does; its BAND line first (a floor slower than slem-dask gives no
    ratio), then the RATIO line, and both ratios kept in ``result``."""
    med = statistics.median
    print(f"[{sched}] {heading}: {spread(times)}: {runs_line(times)}")
    fb = band(
        f"{bench} [{sched}] floor / slem-dask",
        times,
        totals,
        args.band,
        names=("floor", "slem-dask"),
        floor=True,
    )
    if fb["ratio"] is not None:
        print(
            f"[{sched}] RATIO floor_time / slem_time = {fb['ratio']:.3f} (best); "
            f"{med(times) / med(totals):.3f} (medians)  [goal >= 1/1.15 = 0.870; 1.0: "
            f"slem-dask does no work beyond the floor]"
        )
    result.update(
        {
            f"{sched}_floor_runs": times,
            f"{sched}_ratio_floor_best": min(times) / min(totals),
            f"{sched}_ratio_floor_median": med(times) / med(totals),
        }
    )
