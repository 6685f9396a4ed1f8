#!/usr/bin/env bash
# Run every benchmark at its default size (n = 1e6, d = 512 float32; memory: 1e6 and 4e6).
# Extra arguments are passed to each script, e.g. `benchmarks/run_all.sh --quick`
# or `benchmarks/run_all.sh --workdir /scratch/slem-bench`.
# Each script's output is printed and also saved to benchmarks/_data/logs/<script>.log.
# Needs: the project installed with the `bench` extra (psutil); about 14 GB free disk
# under the workdir (1e6 and 4e6 row stores, two 1e6-row encode outputs) and, for numpy's reference
# at 4e6 rows, ~10 GB free RAM (it is skipped otherwise).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python}"
if [ -x "$here/../.venv/bin/python" ] && [ -z "${PYTHON:-}" ]; then python="$here/../.venv/bin/python"; fi
logs="$here/_data/logs"
mkdir -p "$logs"
echo "uptime before: $(uptime)"
for script in bench_fit bench_encode bench_memory; do
    echo
    "$python" "$here/$script.py" "$@" 2>&1 | tee "$logs/$script.log"
done
echo
echo "uptime after: $(uptime)"
echo "summary (each script's RATIO, PEAK and BAND lines; its full RESULT line is in its log):"
for script in bench_fit bench_encode bench_memory; do
    grep '^\(\[[^]]*\] \)\?\(RATIO\|PEAK\|BAND [^{]\)' "$logs/$script.log" | sed "s/^/$script: /" || true
done
echo "compare two runs' bands: python benchmarks/compare_bands.py RUN1.log RUN2.log"
