"""Does the device's measured matmul roof tell whether a precision knob can pay? (planner/adaptive.py's
`_precision_prospect`.)

Prints the CPU and its measured roofs (collectors.flops, the peak calibration analyze runs), then, for the
fixtures without convolutions, each recommendation's settings with and without amp=bf16 (and
matmul_precision=medium where asked) re-measured in lockstep rounds (search_quality.remeasure), as ratios. Where
the roof puts bf16 below float32, the planner does not try these knobs; these ratios are what it would have found.

    python benchmarks/precision_roof.py [--out DIR]
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

from search_quality import interval, remeasure  # this folder is on sys.path when run as a script

from tune_advisor import environment, knobs
from tune_advisor.collectors import flops

ROOT = Path(__file__).resolve().parents[1]
# (fixture, the settings measured with and without the knob, the knobs): the recommendations of a 1-minute run
CASES = [("tiny_batch_mlp.py", {"batch_size": 512, "optimizer_impl": "fused"}, ("amp",)),
         ("lstm_collate.py", {}, ("amp",)),
         ("lstm_collate.py", {"batch_size": 256}, ("amp",)),
         ("raw_sensor_mlp.py", {}, ("amp", "matmul_precision"))]
VALUE = {"amp": "bf16", "matmul_precision": "medium"}


def baseline_of(path: Path) -> dict:
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, "BASELINE", {})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "precision_roof")
    args = parser.parse_args()
    print(f"CPU: {environment.cpu_model()}; flags: {', '.join(environment.cpu_flags())}")
    peaks, status = flops.ensure_peaks("cpu")
    print(f"measured roofs ({status}): " + ", ".join(f"{k} {v / 1e9:,.0f} GFLOP/s" for k, v in (peaks or {}).items()))
    for name, rec, which in CASES:
        path = ROOT / "fixtures" / name
        settings = knobs.full_settings({**baseline_of(path), **rec})
        for knob in which:
            folder = args.out / path.stem / f"{knob}-{'-'.join(f'{k}{v}' for k, v in rec.items()) or 'baseline'}"
            vs = remeasure(path, settings, {**settings, knob: VALUE[knob]}, folder, [])
            print(f"{path.stem} {knobs.describe(rec) or '(baseline)'}: {knob}={VALUE[knob]} over float32 "
                  f"{interval(vs)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
