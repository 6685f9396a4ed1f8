"""Run a slem-dask job spec on a SLURM cluster, with workers started by dask-jobqueue.

    pip install "slem-dask[slurm]"
    python deploy/slurm/slurm_run.py jobs/corpus_reprocess.toml --jobs 8 --cores 16 \
        --memory 64GB --walltime 04:00:00 --queue normal --venv $HOME/slem-dask/.venv
    python deploy/slurm/slurm_run.py SPEC --print-job-script   # show the worker batch script

This process runs the scheduler and the job's client (run it on a login node, or inside
the small allocation of deploy/slurm/slem-job.sbatch); each SLURM job it submits runs
`--processes` single-threaded-BLAS dask workers that share `--cores` cores.
"""

from __future__ import annotations

import argparse
import sys


def make_cluster(
    cores: int = 16,
    processes: int | None = None,
    memory: str = "64GB",
    walltime: str = "04:00:00",
    queue: str | None = None,
    account: str | None = None,
    venv: str | None = None,
    interface: str | None = None,
    local_directory: str = "$TMPDIR",
):
    """A dask_jobqueue.SLURMCluster configured for slem-dask (no jobs submitted yet)."""
    from dask_jobqueue import SLURMCluster

    prologue = ["export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1"]
    python = {}
    if venv:
        prologue.append(f"source {venv}/bin/activate")
        # dask-jobqueue writes the workers' command with this process's sys.executable
        # unless told otherwise: a login node's Python, which the compute nodes may not
        # have, and never the packages of --venv
        python = {"python": f"{venv.rstrip('/')}/bin/python"}
    return SLURMCluster(
        cores=cores,
        processes=processes or cores,  # one single-threaded worker per core
        memory=memory,
        walltime=walltime,
        queue=queue,
        account=account,
        interface=interface,
        local_directory=local_directory,
        job_name="slem-dask-worker",
        job_script_prologue=prologue,
        **python,
    )


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("spec", help="job spec (TOML); its [cluster] table is ignored here")
    p.add_argument("--jobs", type=int, default=4, help="SLURM jobs of workers to submit")
    p.add_argument("--cores", type=int, default=16)
    p.add_argument("--processes", type=int, default=None)
    p.add_argument("--memory", default="64GB")
    p.add_argument("--walltime", default="04:00:00")
    p.add_argument("--queue", default=None)
    p.add_argument("--account", default=None)
    p.add_argument("--venv", default=None, help="virtualenv to activate in worker jobs")
    p.add_argument("--interface", default=None, help="network interface, e.g. ib0")
    p.add_argument("--overwrite", action="store_true")
    p.add_argument(
        "--print-job-script",
        action="store_true",
        help="print the worker batch script and exit without submitting",
    )
    args = p.parse_args(argv)

    from slem_dask.pipeline.jobspec import load_spec, run_spec

    spec = load_spec(args.spec)  # fail on a bad spec before anything is submitted
    cluster = make_cluster(
        args.cores,
        args.processes,
        args.memory,
        args.walltime,
        args.queue,
        args.account,
        args.venv,
        args.interface,
    )
    try:
        if args.print_job_script:
            print(cluster.job_script())
            return 0
        from distributed import Client

        from slem_dask.cluster.connect import SingleThreadedBLAS

        cluster.scale(jobs=args.jobs)
        with Client(cluster) as client:
            client.register_plugin(SingleThreadedBLAS())
            client.wait_for_workers(1, timeout=3600)
            for report in run_spec(client, spec, overwrite=args.overwrite):
                print("\n".join(report.lines()))
    finally:
        cluster.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
