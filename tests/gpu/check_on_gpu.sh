#!/usr/bin/env bash
# The checks that need a CUDA GPU, as one script for a machine lent for a few minutes: what the machine is, the
# tests in tests/gpu/, then example analyses with --device cuda into reports/gpu/.
#
#   tests/gpu/check_on_gpu.sh OUTDIR [FIXTURE:SECONDS[:NAME] ...]   e.g. tests/gpu/check_on_gpu.sh /tmp/out cnn:240:cnn_240s
#
# Each analysis goes to reports/gpu/NAME (NAME defaults to the fixture's).
#
# Runs from the repository root without installing (PYTHONPATH=src): such machines often have torch and the
# dependencies but no package index. Logs go to OUTDIR as they are written, and reports/gpu/ is packed into
# OUTDIR/gpu_reports.tar.gz after each analysis, so a run cut short still leaves what it measured.
set -u
out=${1:?usage: check_on_gpu.sh OUTDIR [FIXTURE:SECONDS[:NAME] ...]}
shift
mkdir -p "$out" reports/gpu
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
py=${PYTHON:-python3}

{
    date -u
    nvidia-smi
    $py -c "import sys, torch; print(sys.version); print('torch', torch.__version__, 'cuda', torch.version.cuda,
'cudnn', torch.backends.cudnn.version(), torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))"
    lscpu | sed -n '1,20p'
    $py -m tune_advisor env
} >"$out/env.txt" 2>&1

# pytest-timeout, where installed, bounds each test, so one hang cannot eat the lease; -rs lists skips and why.
per_test=$($py -c "import pytest_timeout" 2>/dev/null && echo "--timeout 150")
timeout 300 $py -m pytest tests/gpu -v -p no:cacheprovider -rs $per_test 2>&1 | tee "$out/gpu_tests.log"

for item in "$@"; do
    IFS=: read -r fixture seconds name <<<"$item"
    name=${name:-$fixture}
    echo "=== analyze $fixture --device cuda --budget ${seconds}s -> reports/gpu/$name" | tee -a "$out/analyze.log"
    timeout $((seconds + 90)) $py -m tune_advisor analyze "fixtures/$fixture.py" -o "reports/gpu/$name" \
        --device cuda --budget "${seconds}s" --quiet 2>&1 | tee -a "$out/analyze.log"
    echo "=== exit ${PIPESTATUS[0]}" | tee -a "$out/analyze.log"
    tar czf "$out/gpu_reports.tar.gz" reports/gpu
done
