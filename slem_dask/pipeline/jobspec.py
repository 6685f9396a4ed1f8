"""Job specs: one TOML file describes a whole run (``slem-dask run SPEC.toml``).

A spec is re-runnable on a schedule: the fit step merges only negatives
appended since the last run (``update = true``), and each encode step writes
only what is missing or new, re-encoding when the model changed. See
``jobs/*.toml`` for ready specs. Relative paths are taken from the current
working directory, like every other path on the command line.
"""

from __future__ import annotations

import math
import sys
from dataclasses import MISSING, dataclass, field, fields

from ..core.kernel_defaults import KERNEL_DEFAULTS

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["JobSpec", "load_spec", "SpecError"]


class SpecError(ValueError):
    """A job spec that cannot be run; the message names the key and what is allowed."""


@dataclass(frozen=True)
class ClusterSpec:
    scheduler: str | None = None
    workers: int | None = None
    threads_per_worker: int | None = None
    task_timeout: float | None = None  # seconds without a finished task: give up


@dataclass(frozen=True)
class GenerateSpec:
    """Write the synthetic demo corpus to ``path`` if it is not there yet."""

    path: str
    n_negatives: int = 50_000
    n_instances: int = 1_000
    dim: int = 128
    seed: int = 0


@dataclass(frozen=True)
class ModelSpec:
    path: str
    type: str = "linear"
    lam: float | str | None = None  # linear: "0.01x" (times tr(Sigma)); kernel: 1e-3
    theta: float = 1.0
    precision: str = "auto"  # type = "linear" only
    # type = "kernel" only (see KernelSLEM):
    kernel: str = "rbf"
    gamma: float | str = KERNEL_DEFAULTS["gamma"]  # a number, or "<c>x": c / median sq. distance
    degree: int = KERNEL_DEFAULTS["degree"]
    rank: int | None = KERNEL_DEFAULTS["rank"]
    pivoting: str = KERNEL_DEFAULTS["pivoting"]
    tol: float = KERNEL_DEFAULTS["tol"]
    seed: int = KERNEL_DEFAULTS["random_state"]
    kernel_memory: str = "auto"  # KernelSLEM's strategy: "auto" | "in-memory" | "streaming"


@dataclass(frozen=True)
class FitSpec:
    negatives: str
    partition_rows: int | None = None
    update: bool = True
    repivot: bool = False  # type = "kernel" only: an update refits the pivots on all rows


@dataclass(frozen=True)
class EncodeSpec:
    positives: str
    out: str
    dtype: str | None = None
    partition_rows: int | None = None
    on_model_change: str = "reencode"
    precision: str | None = None


@dataclass(frozen=True)
class JobSpec:
    model: ModelSpec
    fit: FitSpec | None = None
    encode: tuple[EncodeSpec, ...] = ()
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    generate: GenerateSpec | None = None
    source: str = "<spec>"


_CHOICES = {
    ("model", "type"): ("linear", "kernel"),
    ("model", "kernel"): ("linear", "rbf", "quad", "poly", "intersection", "chi2"),
    ("model", "pivoting"): ("greedy", "rpcholesky"),
    ("model", "kernel_memory"): ("auto", "in-memory", "streaming"),
    ("encode", "dtype"): ("float32", "float64"),
    ("encode", "on_model_change"): ("reencode", "fail"),
    ("model", "precision"): ("auto", "float64"),
    ("encode", "precision"): ("auto", "float64"),
}


def _build(cls, table, where: str):
    if not isinstance(table, dict):
        raise SpecError(f"{where} must be a table ([{where}]), got {type(table).__name__}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise SpecError(
            f"unknown key {where}.{unknown[0]}; allowed keys in [{where}]: {', '.join(known)}"
        )
    section = where.split("[")[0]
    values = {}
    for name, f in known.items():
        if name not in table:
            if f.default is MISSING and f.default_factory is MISSING:
                raise SpecError(f"missing key {where}.{name} (required)")
            continue
        value = table[name]
        kind = str(f.type)
        if name in ("lam", "gamma"):
            values[name] = _relative_value(value, f"{where}.{name}", name)
            continue
        if "bool" in kind:
            ok = isinstance(value, bool)
            expected = "true or false"
        elif "int" in kind:
            low = 0 if name == "seed" else 1
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
            expected = f"an integer >= {low}"
        elif "float" in kind:
            low_ok = (lambda v: 0 <= v < 1) if name == "tol" else (lambda v: v > 0)
            ok = (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and math.isfinite(value)
                and low_ok(value)
            )
            expected = "a number in [0, 1)" if name == "tol" else "a number > 0"
        else:
            ok = isinstance(value, str) and value != ""
            expected = "a non-empty string"
        choices = _CHOICES.get((section, name))
        if ok and choices and value not in choices:
            ok, expected = False, "one of " + ", ".join(repr(c) for c in choices)
        if not ok:
            raise SpecError(f"{where}.{name} = {value!r}: expected {expected}")
        values[name] = float(value) if "float" in kind and "int" not in kind else value
    return cls(**values)


def _relative_value(value, where: str, name: str):
    """A spec's lam or gamma: a number > 0 (absolute) or "<c>x" (lam: c times the
    negatives' tr(Sigma); gamma: c over their median squared distance)."""
    from ..core.validation import parse_lam
    from ..models.kernel_defaults import parse_gamma

    try:
        if isinstance(value, bool):
            raise TypeError
        c, relative = parse_lam(value, where) if name == "lam" else parse_gamma(value)
    except (TypeError, ValueError):
        what = (
            'c times the negatives\' total variance tr(Sigma), e.g. "0.01x", the default'
            if name == "lam"
            else "c over the negatives' median squared distance, e.g. "
            f'"{KERNEL_DEFAULTS["gamma"]}", the default'
        )
        raise SpecError(
            f'{where} = {value!r}: expected a number > 0 (absolute) or a string "<c>x" ({what})'
        ) from None
    return f"{c:g}x" if relative else c


def parse_spec(data: dict, source: str = "<spec>") -> JobSpec:
    allowed = ("cluster", "generate", "model", "fit", "encode")
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise SpecError(f"{source}: unknown section [{unknown[0]}]; allowed: {', '.join(allowed)}")
    if "model" not in data:
        raise SpecError(f"{source}: missing section [model] (keys: path, type, lam, theta)")
    encode = data.get("encode", [])
    if isinstance(encode, dict):
        encode = [encode]
    if not isinstance(encode, list):
        raise SpecError(f"{source}: [[encode]] must be an array of tables")
    _check_model_type_keys(data, source)
    try:
        spec = JobSpec(
            model=_build(ModelSpec, data["model"], "model"),
            fit=_build(FitSpec, data["fit"], "fit") if "fit" in data else None,
            encode=tuple(_build(EncodeSpec, e, f"encode[{i}]") for i, e in enumerate(encode)),
            cluster=_build(ClusterSpec, data.get("cluster", {}), "cluster"),
            generate=_build(GenerateSpec, data["generate"], "generate")
            if "generate" in data
            else None,
            source=source,
        )
    except SpecError as exc:
        raise SpecError(f"{source}: {exc}") from None
    if spec.fit is None and not spec.encode:
        raise SpecError(
            f"{source}: the spec has no [fit] and no [[encode]] step, so it "
            f"would do nothing; add a [fit] section (negatives = PATH) and/or "
            f"[[encode]] sections (positives = PATH, out = PATH), see jobs/demo.toml"
        )
    return spec


def _check_model_type_keys(data: dict, source: str) -> None:
    """Refuse model and fit keys that apply to the other model type (kernel or linear)."""
    kernel_keys = (
        sorted(
            set(data["model"])
            & {"kernel", "gamma", "degree", "rank", "pivoting", "tol", "seed", "kernel_memory"}
        )
        if isinstance(data["model"], dict)
        else []
    )
    if kernel_keys and data["model"].get("type", "linear") != "kernel":
        raise SpecError(
            f'{source}: model.{kernel_keys[0]} applies to type = "kernel" only; '
            f'set model.type = "kernel" or remove it'
        )
    if (
        isinstance(data["model"], dict)
        and data["model"].get("type") == "kernel"
        and isinstance(data["model"].get("lam"), str)
    ):
        raise SpecError(
            f"{source}: model.lam = {data['model']['lam']!r}: a lambda relative "
            f'to the negatives\' total variance applies to type = "linear"; a '
            f"kernel model's is in the kernel's units: give a number (default "
            f"1e-3)"
        )
    if (
        isinstance(data["model"], dict)
        and isinstance(data.get("fit"), dict)
        and data["fit"].get("repivot")
        and data["model"].get("type", "linear") != "kernel"
    ):
        raise SpecError(
            f'{source}: fit.repivot applies to type = "kernel" only (a linear '
            f"update merges the appended rows exactly); remove it"
        )


def load_spec(path: str) -> JobSpec:
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"job spec {path!r} does not exist; see jobs/ for examples"
        ) from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"{path}: not valid TOML ({exc})") from None
    return parse_spec(data, source=str(path))


def check_inputs(spec: JobSpec) -> None:
    """Check every input path of ``spec`` before a cluster starts or anything is written.

    Paths inside ``[generate] path`` are skipped while that corpus does not exist yet.
    """
    from .. import storage
    from ..models import model_width

    gen = spec.generate.path if spec.generate and not _corpus_exists(spec.generate.path) else None

    def check(key: str, fn, *args):
        if gen and (storage._key(args[0]) + "/").startswith(storage._key(gen) + "/"):
            return
        try:
            fn(*args)
        except (ValueError, TypeError, OSError) as exc:
            text = str(exc)  # "positives: ...": the key already names the input
            name = key.rsplit(".", 1)[-1]
            text = text[len(name) + 2 :] if text.startswith(f"{name}: ") else text
            raise type(exc)(f"{spec.source}: {key}: {text}") from None

    width = {}  # the dimension every positive must have, once known

    def features(path, name, what):  # positives of 0 rows: an empty output, not an error
        width[what] = storage.open_input(path, name, empty_ok=name == "positives").shape[1]

    if spec.fit is not None:
        check("fit.negatives", features, spec.fit.negatives, "negatives", "model")
    elif spec.encode:
        # the model's record alone: its arrays (512 MiB at d = 8192) are read, and
        # checked, once, by the encode step, before it writes anything
        check("model.path", lambda p: width.update(model=model_width(p)), spec.model.path)
    for i, step in enumerate(spec.encode):
        check(f"encode[{i}].positives", features, step.positives, "positives", i)
        if "model" in width and i in width and width[i] != width["model"]:
            # the [fit] step's model is not fitted yet: its negatives' width is what is known
            model = "fit.negatives have" if spec.fit is not None else "the model is fitted on"
            raise SpecError(
                f"{spec.source}: encode[{i}].positives: {step.positives!r} has {width[i]} "
                f"features but {model} {width['model']}; encode descriptors of "
                f"the negatives' dimension"
            )
    check_paths(spec)


def _corpus_exists(path) -> bool:
    """Whether a corpus is there to read (a killed ``[generate]`` leaves only a draft,
    which is no corpus: the step runs again)."""
    from .. import storage

    return storage._exists(path)


def check_paths(spec: JobSpec) -> None:
    """Every store a step writes, against every store any step reads and every other
    store written: none may be, contain or sit inside another, so that no step
    (with --overwrite or not) can replace another step's input. Paths are compared
    canonically and inputs by what they occupy (a glob's files, a folder of shards, an
    HDF5 file), and no output may match an input's glob. Also refuses, before anything
    runs, a written path that holds something slem-dask did not write."""
    from .. import storage

    inputs = {}
    if spec.fit is not None:
        inputs["fit.negatives"] = spec.fit.negatives
    else:
        inputs["model.path"] = spec.model.path  # read by the encode steps only
    for i, step in enumerate(spec.encode):
        inputs[f"encode[{i}].positives"] = step.positives
    outputs = {f"encode[{i}].out": step.out for i, step in enumerate(spec.encode)}
    if spec.fit is not None:
        outputs = {"model.path": spec.model.path, **outputs}
    written = list(outputs.items())
    for k, (key, path) in enumerate(written):
        others = {name: p for name, p in written[k + 1 :]}
        try:
            storage.check_distinct(path, key, inputs, others)
            if storage.exists(storage.canonical(path)):
                storage.check_may_replace(
                    path, "the store at " + key, kind="model" if key == "model.path" else "encoding"
                )
        except (ValueError, OSError) as exc:
            raise type(exc)(f"{spec.source}: {exc}") from None


def run_spec(
    client, spec: JobSpec, overwrite: bool = False, progress: bool = False, on_report=None
):
    """Run every step of ``spec`` on ``client``; return the job reports.

    ``on_report(report)`` is called as each step finishes (the command line prints
    it then, so that a failing later step never hides what earlier ones wrote).
    ``[fit] update = false`` refits the model (from scratch) on every run.
    """
    from .. import pipeline

    check_paths(spec)

    reports = []

    def done(report):
        reports.append(report)
        if on_report is not None:
            on_report(report)

    if spec.generate is not None and not _corpus_exists(spec.generate.path):
        from ..datasets import make_corpus, write_corpus

        g = spec.generate
        write_corpus(
            make_corpus(n_negatives=g.n_negatives, n_instances=g.n_instances, d=g.dim, seed=g.seed),
            g.path,
        )
        report = pipeline.JobReport("generate corpus")
        report.facts.update({"corpus": g.path, "negatives": g.n_negatives})
        done(report)
    if spec.fit is not None:
        done(
            pipeline.fit_job(
                client,
                spec.fit.negatives,
                spec.model.path,
                options=fit_options(spec, overwrite, progress),
                **model_keywords(spec.model),
            )
        )
    for step in spec.encode:
        done(
            pipeline.encode_job(
                client,
                spec.model.path,
                step.positives,
                step.out,
                options=encode_options(step, overwrite, progress),
            )
        )
    return reports


def model_keywords(m: ModelSpec) -> dict:
    """The ``[model]`` table as :func:`slem_dask.pipeline.fit_job`'s model keywords."""
    if m.type == "linear":
        return {"lam": m.lam, "theta": m.theta, "precision": m.precision}
    return {
        "lam": m.lam,
        "theta": m.theta,
        "kernel": m.kernel,
        "gamma": m.gamma,
        "degree": m.degree,
        "rank": m.rank,
        "pivoting": m.pivoting,
        "tol": m.tol,
        "seed": m.seed,
        "kernel_memory": m.kernel_memory,
    }


def fit_options(spec: JobSpec, overwrite: bool, progress: bool):
    """The ``[fit]`` table as a :class:`~slem_dask.pipeline.options.FitOptions`:
    ``update = false`` refits (from scratch) on every run."""
    from .options import FitOptions

    f = spec.fit
    return FitOptions(
        partition_rows=f.partition_rows,
        overwrite=overwrite or not f.update,
        update=f.update,
        progress=progress,
        repivot=f.repivot if spec.model.type != "linear" else False,
    )


def encode_options(step: EncodeSpec, overwrite: bool, progress: bool):
    """One ``[[encode]]`` step as an :class:`~slem_dask.pipeline.options.EncodeOptions`."""
    from .options import EncodeOptions

    return EncodeOptions(
        dtype=step.dtype,
        partition_rows=step.partition_rows,
        overwrite=overwrite,
        progress=progress,
        on_model_change=step.on_model_change,
        precision=step.precision,
    )
