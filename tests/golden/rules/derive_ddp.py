"""Derive synthetic_ddp_straggler.results.json from a real DDP run (tests/golden/ddp_gloo.results.json: `tune-advisor
analyze tests/workloads/tiny_ddp.py --nproc-per-node 2 --strategy grid --min-time 0.5` on a 2-core CPU, gloo).

Its two ranks were balanced; here rank 1's own work per step (its steps without gradient sync) is made 2.5x
slower, so that rank imbalance (TA602) fires. The changes are listed in the "_synthetic" key; they are not
measurements.

    python tests/golden/rules/derive_ddp.py
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

from tune_advisor.distributed.merge import summary

HERE = Path(__file__).resolve().parent
SOURCE = HERE.parent / "ddp_gloo.results.json"
SLOWER = 2.5


def straggler(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    baseline = doc["baseline"]["settings"]
    for probe in [doc["baseline"], *doc["probes"]]:
        ddp = (probe.get("extra") or {}).get("distributed")
        if probe["settings"] != baseline or not ddp:
            continue
        ranks = []
        for r in ddp["ranks"]:
            local = [x * SLOWER if r["rank"] == 1 else x for x in r["raw"]["local_step_s"]]
            ranks.append({"rank": {"rank": r["rank"], **{k: r[k] for k in ("local_rank", "host", "device")},
                                   "backend": ddp["backend"]},
                          "raw": {"step_s": r["raw"]["step_s"], "data_wait_s": r["raw"]["data_wait_s"],
                                  "items": [1.0] * len(r["raw"]["step_s"])},
                          "extra": {"local_step_s": local}, "memory": {"child_maxrss_bytes": r["peak_memory_bytes"]}})
        job = {"step_s": probe["step_time_s"]["samples"]}
        probe["extra"]["distributed"] = summary(ranks, job)
    doc["_synthetic"] = [f"derived from {SOURCE.name} by tests/golden/rules/derive_ddp.py",
                         f"rank 1's steps without gradient sync (local_step_s) made {SLOWER}x slower in the baseline "
                         "probes, and the straggler figures recomputed from them"]
    return doc


if __name__ == "__main__":
    source = json.loads(SOURCE.read_text())
    (HERE / "synthetic_ddp_straggler.results.json").write_text(json.dumps(straggler(source), indent=1) + "\n")
