"""deploy/: what can be checked without Kubernetes or SLURM: manifests parse and carry the
required fields, the dask-jobqueue launcher renders its job script, systemd units are
well-formed, and TLS works on a real local scheduler and worker."""

import configparser
import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import ROOT, local_worker_args, start_dask, start_local_scheduler
import yaml
import zarr

from slem_dask import LinearSLEM, load_model
from slem_dask.pipeline.jobspec import load_spec

DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent


def _load(path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _yaml(name):
    return list(yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()))


def test_daskjob_manifest_has_operator_fields():
    (doc,) = _yaml("daskjob.yaml")
    assert doc["apiVersion"] == "kubernetes.dask.org/v1" and doc["kind"] == "DaskJob"
    job = doc["spec"]["job"]["spec"]["containers"][0]
    assert job["args"][:3] == ["slem-dask", "run", "/etc/slem-dask/job.toml"]
    cluster = doc["spec"]["cluster"]["spec"]
    assert cluster["worker"]["replicas"] >= 1
    assert cluster["worker"]["spec"]["containers"][0]["args"][:2] == ["dask", "worker"]
    assert cluster["scheduler"]["spec"]["containers"][0]["args"] == ["dask", "scheduler"]
    ports = {p["port"] for p in cluster["scheduler"]["service"]["ports"]}
    assert 8786 in ports


def test_cronjob_and_configmap_hold_a_valid_spec(tmp_path):
    (cron,) = _yaml("cronjob.yaml")
    assert cron["kind"] == "CronJob" and cron["apiVersion"] == "batch/v1"
    assert len(cron["spec"]["schedule"].split()) == 5
    assert cron["spec"]["concurrencyPolicy"] == "Forbid"
    pod = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["args"][:2] == ["slem-dask", "run"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["DASK_SCHEDULER_ADDRESS"].startswith("tcp://")
    (cm,) = _yaml("job-spec-configmap.yaml")
    assert cm["kind"] == "ConfigMap"
    (tmp_path / "job.toml").write_text(cm["data"]["job.toml"])
    spec = load_spec(str(tmp_path / "job.toml"))  # the spec the pods run parses
    assert spec.fit is not None and spec.encode


def test_dockerfile_installs_the_package():
    text = (DEPLOY / "docker" / "Dockerfile").read_text()
    assert "pip install" in text and "COPY slem_dask" in text and "slem-dask" in text


def test_slurm_launcher_renders_job_script(tmp_path):
    launcher = _load(DEPLOY / "slurm" / "slurm_run.py")
    cluster = launcher.make_cluster(
        cores=8,
        memory="32GB",
        walltime="02:00:00",
        queue="normal",
        account="proj",
        venv="/opt/venv",
    )
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    assert "#SBATCH -p normal" in script and "#SBATCH -A proj" in script
    assert "#SBATCH -t 02:00:00" in script
    assert "source /opt/venv/bin/activate" in script
    assert "OMP_NUM_THREADS=1" in script
    assert "--nworkers 8" in script and "--nthreads 1" in script
    # the workers run the Python of --venv, not the one that rendered the script
    assert "/opt/venv/bin/python -m distributed.cli.dask_worker" in script
    assert sys.executable not in script


def test_slurm_launcher_without_venv_keeps_this_python(tmp_path):
    launcher = _load(DEPLOY / "slurm" / "slurm_run.py")
    cluster = launcher.make_cluster(cores=2, memory="4GB")
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    assert f"{sys.executable} -m distributed.cli.dask_worker" in script


def test_slurm_launcher_print_job_script_cli(tmp_path, capsys):
    launcher = _load(DEPLOY / "slurm" / "slurm_run.py")
    assert (
        launcher.main(
            [str(ROOT / "jobs" / "corpus_reprocess.toml"), "--cores", "4", "--print-job-script"]
        )
        == 0
    )
    assert "#!/usr/bin/env bash" in capsys.readouterr().out


def test_systemd_units_are_well_formed():
    for name in (
        "dask-scheduler.service",
        "dask-worker@.service",
        "slem-reprocess.service",
        "slem-reprocess.timer",
    ):
        parser = configparser.ConfigParser(interpolation=None, strict=True)
        parser.optionxform = str
        parser.read_string((DEPLOY / "hosts" / name).read_text())
        assert "Unit" in parser
        if name.endswith(".service"):
            assert parser["Service"]["ExecStart"].startswith("/opt/slem-dask/.venv/bin/")
        else:
            assert parser["Timer"]["OnCalendar"]
    assert "slem-dask run" in (DEPLOY / "hosts" / "slem-reprocess.service").read_text()


def test_tls_config_is_dask_config():
    cfg = yaml.safe_load((DEPLOY / "tls" / "dask-tls.yaml").read_text())
    tls = cfg["distributed"]["comm"]["tls"]
    assert cfg["distributed"]["comm"]["require-encryption"] is True
    for role in ("scheduler", "worker", "client"):
        assert set(tls[role]) == {"cert", "key"}


@pytest.mark.cluster
def test_cli_over_tls_with_generated_certificates(tmp_path):
    certs = _load(DEPLOY / "tls" / "make_certs.py").make_certs(str(tmp_path / "tls"))
    tls = ["--tls-ca-file", certs["ca"], "--tls-cert", certs["cert"], "--tls-key", certs["key"]]
    scheduler, address = start_local_scheduler(
        tmp_path / "scheduler.json", "--protocol", "tls", *tls
    )
    procs = [scheduler]
    try:
        assert address.startswith("tls://")
        procs.append(start_dask(local_worker_args(address, "w0", *tls)))
        x = np.random.default_rng(0).standard_normal((500, 8)).astype("float32")
        zarr.create_array(
            str(tmp_path / "neg.zarr"), shape=x.shape, dtype="float32", chunks=(100, 8)
        )[...] = x
        cmd = [
            str(BIN / "slem-dask"),
            "fit",
            "--negatives",
            str(tmp_path / "neg.zarr"),
            "--model",
            str(tmp_path / "model.zarr"),
            "--scheduler",
            address,
            "--no-progress",
        ]
        plain = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert plain.returncode != 0  # a TLS scheduler refuses a client without certificates
        assert not (tmp_path / "model.zarr").exists()
        done = subprocess.run(cmd + tls, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        got, want = (
            load_model(str(tmp_path / "model.zarr")),
            LinearSLEM(precision="float64").fit(x),
        )  # float32 negatives: the 1e-5 precision contract
        assert (
            np.abs(got.covariance_ - want.covariance_).max()
            <= 1e-5 * np.abs(want.covariance_).max()
        )
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=30)


def test_worker_dask_config_matches_local_clusters():
    from slem_dask.cluster.connect import WORKER_MALLOC

    cfg = yaml.safe_load((DEPLOY / "dask" / "slem-workers.yaml").read_text())
    environ = cfg["distributed"]["nanny"]["pre-spawn-environ"]
    assert {
        f"distributed.nanny.pre-spawn-environ.{k}": v for k, v in environ.items()
    } == WORKER_MALLOC
    assert "/etc/dask/slem-workers.yaml" in (DEPLOY / "docker" / "Dockerfile").read_text()
