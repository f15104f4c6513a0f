"""Does a probe report the throughput a plain training loop gets? (SPEC §4: within 5%.)

For every fixture, at its BASELINE settings (and bf16 for the CNN): a probe child and a plain hand-written loop
(hand_loop.py, same settings, same number of measured steps) run alternately, ROUNDS times each, in one run, so
machine drift hits both alike. Prints the medians and the gap.

    python benchmarks/fidelity.py [FIXTURE.py ...]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tune_advisor import api
from tune_advisor.probe.spec import Protocol

ROOT = Path(__file__).resolve().parents[1]
ROUNDS = 5
PROTOCOL = Protocol(warmup_steps=3, min_steps=20, min_time_s=2.0, max_time_s=15.0)
CASES = {  # fixture -> extra settings over its BASELINE
    "io_bound.py": [{}],
    "augment_cpu.py": [{}],
    "tiny_batch_mlp.py": [{}],
    "cnn.py": [{}, {"amp": "bf16"}],
    "hf_transformer.py": [{}],
    "lstm_collate.py": [{}],
}


def hand_loop(path: Path, settings: dict, steps: int) -> float:
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "hand_loop.py"), str(path),
                          json.dumps(settings), str(steps)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["items_per_s"]


def main(names: list[str]) -> int:
    rows = []
    workdir = Path(tempfile.mkdtemp(prefix="fidelity-"))
    for name in names or list(CASES):
        path = ROOT / "fixtures" / name
        for extra in CASES.get(name, [{}]):
            probe_rates, hand_rates = [], []
            for _ in range(ROUNDS):
                _, result = api.probe(path, extra, device="cpu", protocol=PROTOCOL, workdir=workdir)
                if not result.ok:
                    print(f"{name} {extra}: probe {result.status.value}: {result.error}")
                    break
                probe_rates.append(result.throughput()[0])
                hand_rates.append(hand_loop(path, result.settings, len(result.step_s)))
                print(f"{name} {extra or ''} round {len(probe_rates)}: probe {probe_rates[-1]:.1f}, "
                      f"hand loop {hand_rates[-1]:.1f} {result.unit} over {len(result.step_s)} steps", flush=True)
            if not probe_rates:
                continue
            probe_rate, hand_rate = statistics.median(probe_rates), statistics.median(hand_rates)
            gap = probe_rate / hand_rate - 1
            rows.append((name, json.dumps(extra) if extra else "BASELINE", probe_rate, hand_rate, gap,
                         result.unit))
    print(f"\n{'fixture':<20} {'settings':<18} {'probe':>12} {'hand loop':>12} {'gap':>7}  unit   (median of {ROUNDS})")
    for name, settings, p, h, gap, unit in rows:
        flag = "" if abs(gap) <= 0.05 else "  <-- over 5%"
        print(f"{name:<20} {settings:<18} {p:>12.1f} {h:>12.1f} {gap:>+7.1%}  {unit}{flag}")
    return 0 if all(abs(r[4]) <= 0.05 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
