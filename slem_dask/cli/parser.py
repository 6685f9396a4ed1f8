"""The ``slem-dask`` command line's options: the parser and the checks of option
combinations that argparse cannot express (:mod:`slem_dask.cli.main` runs the commands).
Each command's options are built in a sibling module: ``parser_jobs`` (demo, fit, encode,
run, search), ``parser_evaluate``, ``parser_stores``; the option groups they share in
``parser_groups`` and the options' value types in ``parser_types``."""

from __future__ import annotations

import argparse
import os
import re
import sys

from .._version import __version__
from .parser_evaluate import _add_evaluate_command
from .parser_jobs import (
    _add_demo_command,
    _add_encode_command,
    _add_fit_command,
    _add_run_command,
    _add_search_command,
)
from .parser_stores import _add_store_commands
from ..core.kernel_defaults import KERNEL_DEFAULTS as MODEL_DEFAULTS

#: Kernel options of `fit` and their defaults, applied only with --kernel.
KERNEL_DEFAULTS = {
    **{name: MODEL_DEFAULTS[name] for name in ("gamma", "degree", "rank", "pivoting", "tol")},
    "seed": MODEL_DEFAULTS["random_state"],
    "kernel_memory": "auto",
    "repivot": False,
}


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a malformed command line is said in one line, like every other error
    (argparse printed its usage block of 8-13 lines first): the command, what is wrong
    (the option, the value, what it takes) and where its options are listed. The
    commands' parsers are of this class too (argparse makes them of their parent's)."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._given = list(sys.argv[1:] if args is None else args)  # for error()
        return super().parse_known_args(args, namespace)

    def error(self, message: str):  # type: ignore[override]
        listed = "the commands" if " " not in self.prog else "the options"
        message += _dash_value_hint(message, getattr(self, "_given", []), self)
        self.exit(2, f"{self.prog}: error: {message} (`{self.prog} --help` lists {listed})\n")


def _dash_value_hint(message: str, given: list, parser: argparse.ArgumentParser) -> str:
    """For "argument --lam: expected one argument" after ``--lam -1x``: argparse read the
    value, which starts with one '-' and is no plain negative number, as an option. A
    value of two dashes (``--lam --model``, a mistyped ``--positivs``) is a missing
    value: no hint. A value that the option's type refuses is said with that refusal."""
    found = re.fullmatch(r"argument (\S+): expected one argument", message)
    names = found.group(1).split("/") if found else []
    for option, value in zip(map(str, given), map(str, given[1:]), strict=False):
        if option not in names or not value.startswith("-") or value.startswith("--"):
            continue
        said = f"; its value {value!r} starts with '-' and was read as an option"
        convert = getattr(parser._option_string_actions.get(option), "type", None)
        try:
            if callable(convert):
                convert(value)
        except (argparse.ArgumentTypeError, TypeError, ValueError) as exc:
            return f"{said}, and as a value it is refused too: {exc}"
        return f"{said}: write {option}={value}"
    return ""


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="slem-dask",
        description="Square-loss exemplar machines for image retrieval, on Dask. "
        "PATH arguments are descriptors as zarr v3 or v2 arrays, .npy files or folders of "
        ".npy shards, HDF5 (FILE.h5:/dataset) or .fvecs/.bvecs/.ivecs: a local path, "
        "or for zarr an object store URL (s3://, gs://, az://).",
    )
    parser.add_argument("--version", action="version", version=f"slem-dask {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    _add_demo_command(sub)
    _add_fit_command(sub)
    _add_encode_command(sub)
    _add_run_command(sub)
    _add_search_command(sub)
    _add_evaluate_command(sub)
    _add_store_commands(sub)
    parser.commands = sub.choices  # command -> its parser, for errors in its own words
    return parser


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """parse_args, but an unknown option is reported by its command's parser (its usage,
    not the top-level one) with the closest option it has: argparse itself leaves
    unknown options to the top-level parser."""
    import difflib

    args, unknown = parser.parse_known_args(argv)
    if unknown:
        command = parser.commands[args.command]
        _check_expanded_glob(command, argv, unknown)
        options = [o for action in command._actions for o in action.option_strings]
        close = difflib.get_close_matches(unknown[0].split("=")[0], options, n=1)
        command.error(
            f"unrecognized arguments: {' '.join(unknown)}"
            + (f"; did you mean {close[0]}?" if close else "")
        )
    return args


def _check_expanded_glob(command: argparse.ArgumentParser, argv: list[str], unknown) -> None:
    """`--positives database/*.npy` unquoted: the shell gave the option the first file and
    left the others as unrecognized arguments; say to quote the glob (usage error)."""
    i = argv.index(unknown[0]) if unknown[0] in argv else -1
    if unknown[0].startswith("-") or i < 2:
        return
    action = command._option_string_actions.get(argv[i - 2])
    if action is None or action.metavar != "PATH" or argv[i - 1].startswith("-"):
        return
    files = [argv[i - 1], *unknown]
    if not all(os.path.exists(f) for f in files):  # what a shell's glob gives exists
        return
    command.error(
        f"{argv[i - 2]} takes one PATH, but the shell gave it {len(files)} "
        f"({' '.join(files[:3])}{' ...' if len(files) > 3 else ''}): quote a glob of .npy "
        f"shards ('dir/*.npy') so that it reaches slem-dask whole, or give their folder"
    )


#: `evaluate`'s options for one's own labelled descriptors (instead of --corpus)
EVALUATE_OWN = ("negatives-from", "database", "queries", "database-labels", "query-labels")


def _check_option_combinations(parser: argparse.ArgumentParser, args) -> None:
    """Options that parse on their own but make no sense together: usage errors (exit 2)."""
    sub = parser._subparsers._group_actions[0].choices[args.command]  # the command's usage
    if args.command == "fit":
        given = [
            f"--{name.replace('_', '-')}"
            for name in KERNEL_DEFAULTS
            if getattr(args, name) is not None
        ]
        if args.kernel is None and given:
            verb = "applies" if len(given) == 1 else "apply"
            sub.error(
                f"{', '.join(given)} {verb} only to kernel SLEM models, but no "
                f"--kernel was given (without it `fit` fits a linear SLEM); add "
                f"--kernel rbf (or another kernel), or drop {', '.join(given)}"
            )
        for name, default in KERNEL_DEFAULTS.items():
            if getattr(args, name) is None:
                setattr(args, name, default)
        args.update = args.update or args.repivot  # --repivot: an update that refits
    if args.command == "evaluate":
        own = {name: getattr(args, name.replace("-", "_")) for name in EVALUATE_OWN}
        # with nearest-neighbour ground truth the labels may be left out (both of them)
        needed = (
            EVALUATE_OWN[:3]
            if args.ground_truth and not any(own[n] for n in own if "labels" in n)
            else own
        )
        if args.corpus is None and not all(own[n] for n in needed):
            missing = [f"--{n}" for n in needed if not own[n]]
            sub.error(
                f"give --corpus, or one's own labelled descriptors with "
                f"{', '.join(f'--{n}' for n in own)} (missing: {', '.join(missing)})"
                + ("" if args.ground_truth else "; with --ground-truth the labels may be left out")
            )
        if args.corpus is not None and any(own.values()):
            sub.error(
                f"--corpus and {', '.join(f'--{n}' for n, v in own.items() if v)} "
                f"both name what to evaluate on; give one or the other"
            )
    if (
        args.command == "evaluate"
        and args.p_at is not None
        and args.k is not None
        and args.p_at > args.k
    ):
        sub.error(
            f"--p-at {args.p_at} is larger than the ranking length --k {args.k}: "
            f"P@{args.p_at} would count missing ranks as misses; use --p-at "
            f"{args.k} or less, or a larger --k"
        )


def _glue_negative_values(argv: list[str]) -> list[str]:
    """``--lam -1e-3`` as ``--lam=-1e-3``: argparse takes '-1e-3' for an option (only
    '-1' and '-.5' look like numbers to it) and would say "expected one argument";
    glued, the value reaches the option's own check, which says what is allowed."""
    out = []
    for token in argv:
        if (
            out
            and out[-1].startswith("--")
            and "=" not in out[-1]
            and token.startswith("-")
            and _is_number_list(token)
        ):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def _is_number_list(text: str) -> bool:
    try:
        [float(v) for v in text.split(",")]
    except ValueError:
        return False
    return True
