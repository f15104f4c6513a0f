"""Work out the example reports' baseline and recommended figures again from each run's own probes, and re-render.

    python reports/refigure.py                          # reports/*/results.json and reports/gpu/*/results.json
    python reports/refigure.py reports/cnn/results.json
    python reports/refigure.py --findings               # the findings too, by the rules as they are now

For runs saved before a change to how `figures`, or the speedup's `later`, are derived (planner/figures.py), where
running the analysis again is not possible (reports/gpu: no GPU here) or would change every other figure too. Nothing is
re-measured: the probes and the speedup stay as the run wrote them, and so do the findings unless `--findings`
asks the rules (rules/) to judge the run's own probes again, for runs saved before a change to a rule. A note in
the run's `notes` says which commit worked the figures (and findings) out again, so the report says so too.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tune_advisor import results, rules
from tune_advisor.planner import figures

ROOT = Path(__file__).resolve().parents[1]
# the note refigure leaves in a run (its older wording first, which a run refigured before a99cd63 holds)
OLD_NOTE = "the baseline's and the recommendation's figures were worked out again from this run's own probes"
NOTE = ("the baseline's and the recommendation's figures, and the range for a later measure of the speedup, were "
        "worked out again from this run's own probes and speedup")
FINDINGS_NOTE = "the findings were judged again from this run's own probes"


def commit() -> str:
    return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=True).stdout.strip()


def refigure(path: Path, at: str, findings: bool = False) -> None:
    document = results.read(path)
    document["figures"] = figures.of_document(document)
    speedup = document.get("speedup")
    if isinstance(speedup, dict):  # where a later measure of the speedup falls: from its own CI, as analyze adds it
        speedup["later"] = figures.later(*(figures.as_float(speedup.get(k)) for k in ("median", "ci_low", "ci_high")))
    notes = [n for n in document.get("notes") or [] if not n.startswith((NOTE, OLD_NOTE, FINDINGS_NOTE))]
    notes.append(f"{NOTE} at commit {at} (by the rules of planner/figures.py there); nothing was re-measured")
    if findings:
        document["findings"] = rules.evaluate(document)
        notes.append(f"{FINDINGS_NOTE} at commit {at} (by the rules of rules/ there); nothing was re-measured")
    document["notes"] = notes
    results.write_atomic(path, document)
    code = subprocess.run([sys.executable, "-m", "tune_advisor", "report", str(path), "--quiet"], cwd=ROOT).returncode
    print(f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: refigured, report exit {code}")


def main(argv: list[str]) -> int:
    findings = "--findings" in argv
    paths = [Path(a).resolve() for a in argv if a != "--findings"] or sorted(
        [*ROOT.glob("reports/*/results.json"), *ROOT.glob("reports/gpu/*/results.json")])
    at = commit()
    for path in paths:
        refigure(path, at, findings)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
