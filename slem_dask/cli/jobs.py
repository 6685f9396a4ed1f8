"""The jobs a command runs on its cluster, and the results it prints."""

from __future__ import annotations

from .checks import _evaluate_arrays


def _jobs(args, client, spec, progress: bool):
    """Run the command's job(s) on ``client``: (reports, rows of a results table)."""
    run = _COMMAND_JOBS.get(args.command, _demo_job)
    return run(args, client, spec, progress)


def _run_job(args, client, spec, progress: bool):
    """``run``: the job spec's steps, each report printed as its step finishes."""
    from ..pipeline.jobspec import run_spec

    run_spec(
        client,
        spec,
        overwrite=args.overwrite,
        progress=progress,
        on_report=lambda r: print("\n".join(r.lines()), flush=True),
    )
    return [], None  # printed as each step finished


def _fit_job(args, client, spec, progress: bool):
    from .. import pipeline
    from ..storage import head_seq

    args.head_before = head_seq(args.model)  # what an interrupt says is committed
    report = pipeline.fit_job(
        client,
        args.negatives,
        args.model,
        options=_fit_options(args, progress),
        **_model_keywords(args),
    )
    return [report], None


def _search_job(args, client, spec, progress: bool):
    from .. import pipeline
    from ..pipeline.options import SearchOptions
    from ..storage import head_seq

    args.head_before = head_seq(args.out)  # what an interrupt says is committed

    options = SearchOptions(
        k=args.k,
        partition_rows=args.partition_rows,
        overwrite=args.overwrite,
        force=args.force,
        progress=progress,
        metric=args.metric,
    )
    return [
        pipeline.search_job(client, args.queries, args.database, args.out, options=options)
    ], None


def _evaluate_job(args, client, spec, progress: bool):
    from ..pipeline import evaluate as evaluation

    try:
        rows, _, report = evaluation.evaluate_job(
            client,
            args.corpus,
            args.methods,
            n_negatives=args.negatives,
            k=args.k,
            p_at=args.p_at,
            plot=args.plot,
            grids=_evaluate_grids(args),
            partition_rows=args.partition_rows,
            arrays=_evaluate_arrays(args),
            ground_truth=args.ground_truth,
        )
    except Exception as exc:
        _print_rows_before_failure(exc)
        raise
    return [report], rows


def _print_rows_before_failure(exc: Exception) -> None:
    """The rows an evaluation computed before one method failed (its error line follows)."""
    from ..pipeline.evaluate import format_table

    done = getattr(exc, "evaluated_rows", None)
    if done:
        print(
            f"evaluate: {exc.failed_method} failed (the error follows); "  # type: ignore[attr-defined]
            f"the {len(done)} row(s) computed before it:"
        )
        print(format_table(done), flush=True)


def _encode_job(args, client, spec, progress: bool):
    from .. import pipeline
    from ..storage import head_seq

    args.head_before = head_seq(args.out)  # what an interrupt says is committed
    report = pipeline.encode_job(
        client,
        args.model,
        args.positives,
        args.out,
        options=_encode_options(args, progress),
        model=getattr(args, "loaded_model", None),
    )
    return [report], None


def _demo_job(args, client, spec, progress: bool):
    from .. import pipeline

    rows, reports = pipeline.demo_job(
        client,
        workdir=args.workdir,
        n_negatives=args.negatives,
        n_instances=args.instances,
        d=args.dim,
        lam=args.lam,
        seed=args.seed,
        progress=progress,
    )
    return reports, rows


#: command -> the function that runs its job(s); any other command (demo) runs the demo
_COMMAND_JOBS = {
    "run": _run_job,
    "fit": _fit_job,
    "search": _search_job,
    "evaluate": _evaluate_job,
    "encode": _encode_job,
}


def _print_results(args, reports, rows) -> None:
    for report in reports:
        print("\n".join(report.lines()))
    if args.command == "demo":
        print()
        _print_table(rows)
    if args.command == "evaluate":
        from ..pipeline.evaluate import format_table

        print()
        print(format_table(rows))


def _print_table(rows: list[dict]) -> None:
    cols = list(rows[0])
    text = [[f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in cols] for r in rows]
    widths = [max(len(c), *(len(t[i]) for t in text)) for i, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip())
    print("  ".join("-" * w for w in widths))
    for t in text:
        print("  ".join(v.ljust(w) for v, w in zip(t, widths, strict=True)).rstrip())


def _evaluate_grids(args) -> dict[str, dict]:
    """`evaluate`'s parameter options as method -> {parameter: [values]}."""
    from ..core.validation import DEFAULT_LAM

    kernel = {
        name: getattr(args, name)
        for name in ("lam", "gamma", "rank")
        if getattr(args, name) is not None
    }
    if "lam" in kernel:  # a lambda relative to tr(Sigma) is linear SLEM's only
        kernel["lam"] = [v for v in kernel["lam"] if not isinstance(v, str)] or [1e-3]
    return {
        "slem": {"lam": args.lam or [DEFAULT_LAM]},
        "kernel": kernel,
        "pca": {"eps": args.pca_eps},
        "esvm": {"lam": args.esvm_lam, "n_iter": args.esvm_iters},
    }


def _model_keywords(args) -> dict:
    """``fit``'s model options as :func:`slem_dask.pipeline.fit_job`'s keywords (they
    build its estimator: a LinearSLEM, or a KernelSLEM with --kernel)."""
    return {
        "lam": args.lam,
        "theta": args.theta,
        "kernel": args.kernel,
        "gamma": args.gamma,
        "degree": args.degree,
        "rank": args.rank,
        "pivoting": args.pivoting,
        "tol": args.tol,
        "seed": args.seed,
        "precision": args.precision,
        "kernel_memory": args.kernel_memory,
    }


def _fit_options(args, progress: bool):
    """``fit``'s options of how the job runs, as a FitOptions."""
    from ..pipeline.options import FitOptions

    return FitOptions(
        partition_rows=args.partition_rows,
        overwrite=args.overwrite,
        update=args.update,
        repivot=args.repivot,
        progress=progress,
    )


def _encode_options(args, progress: bool):
    """``encode``'s options, as an EncodeOptions."""
    from ..pipeline.options import EncodeOptions

    return EncodeOptions(
        dtype=args.dtype,
        partition_rows=args.partition_rows,
        overwrite=args.overwrite,
        progress=progress,
        precision=args.precision,
    )
