"""Measuring for the gate: which settings, several rounds of probes, and the workload as it was at a git ref."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import api, knobs, results
from ..errors import UsageError
from ..probe.backend import ProbeBackend
from ..probe.result import ProbeResult
from ..probe.spec import ProbeSpec, Protocol

OnProbe = Callable[[str, int, int], None]  # (side, round number, rounds)


def resolve_settings(spec: Sequence[str] | None, info: api.Inspection, *, from_results: Path | None = None,
                     recorded: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every knob's value for `--settings`.

    Nothing given: the settings recorded in the baseline file (compare like with like), else the file's BASELINE.
    `baseline`: the file's BASELINE. `recommended`: the recommended settings of `--from-results`.
    KNOB=VALUE pairs (repeatable, or comma-separated): over the file's BASELINE.
    """
    words = [w.strip() for item in (spec or []) for w in str(item).split(",") if w.strip()]
    if not words:
        return knobs.full_settings(recorded) if recorded else dict(info.baseline)
    if words == ["baseline"]:
        return dict(info.baseline)
    if words == ["recommended"]:
        if from_results is None:
            raise UsageError("--settings recommended reads the recommendation of an analysis: add "
                             "--from-results tune-advisor-report/<name>/results.json")
        document = results.read(from_results)
        recommended = (document.get("recommended") or {}).get("settings")
        if not recommended:
            raise UsageError(f"{from_results}: has no recommended settings (the analysis did not finish); "
                             f"run tune-advisor analyze again")
        try:
            return knobs.full_settings(knobs.validate_settings(recommended))
        except ValueError as exc:
            raise UsageError(f"{from_results}: recommended settings: {exc}") from None
    pairs = {}
    for word in words:
        name, sep, value = word.partition("=")
        if not sep or not name.strip():
            raise UsageError(f"--settings {word!r}: expected recommended, baseline, or KNOB=VALUE pairs "
                             f"(e.g. --settings batch_size=64,amp=bf16)")
        pairs[name.strip()] = value.strip()
    try:
        return {**info.baseline, **knobs.validate_settings(pairs)}
    except ValueError as exc:
        raise UsageError(f"--settings: {exc}") from None


def check_applicable(settings: dict[str, Any], info: api.Inspection, device: str) -> None:
    facts = api.device_facts(device)
    for name, value in settings.items():
        if value == knobs.KNOBS[name].default:
            continue
        reason = knobs.not_applicable(name, value, info.facts, facts, settings)
        if reason:
            raise UsageError(f"settings {name}={value}: {reason}")


def measure(sides: dict[str, tuple[api.Inspection, dict[str, Any]]], rounds: int, *, backend: ProbeBackend,
            device: str, protocol: Protocol, timeout_s: float, seed: int = 0, start: int = 0,
            on_probe: OnProbe | None = None) -> dict[str, list[ProbeResult]]:
    """`rounds` probes of each side (numbered from `start` + 1: more rounds of a gate already measured), run by
    `backend` (executors.gate_backend). With two sides, each round runs both at once in lockstep (`backend.pair`:
    probe/lockstep.py): they take turns step by step, so both see the same state of a machine whose speed changes
    every few seconds; where the backend cannot pair (--executor ray), one after the other.

    The steps alternate A B, B A, ... within a round, and the side that moves (or runs) first alternates between
    rounds, so neither side always follows the other (a cache warmed, a core woken up). As the analysis's
    confirmation does, each round's probes fork from new parent processes (`ProbeSpec.fresh_parent`; a pair's two
    start side by side), and the side that moves first takes zygote slot 0: a zygote's children share its memory
    layout, which set a setting's speed by up to 15% (docs/planner.md, the confirmation), so an offset between two
    long-lived parents would repeat in every round and read as a regression (1 false alarm in 7 unchanged runs on
    an AVX2-only EPYC, issue 64).
    """
    names = list(sides)
    measured: dict[str, list[ProbeResult]] = {name: [] for name in names}
    for i in range(start, start + rounds):
        specs = [ProbeSpec(id=f"{name}-{i + 1}", workload=str(sides[name][0].path), settings=sides[name][1],
                           device=device, protocol=protocol, timeout_s=timeout_s, seed=seed, fresh_parent=True,
                           preload=sides[name][0].preload)
                 for name in names]
        roles = [f"gate:{name}" for name in names]
        if on_probe:
            on_probe(" and ".join(names), i + 1, start + rounds)
        if len(names) == 2 and backend.can_pair:
            probes = backend.pair(specs, roles, first=i % 2)
        else:
            order = list(range(len(names)))[::-1 if i % 2 else 1]
            done = {k: backend.run(specs[k], roles[k]) for k in order}
            probes = [done[k] for k in range(len(names))]
        for name, probe in zip(names, probes):
            measured[name].append(probe)
    return measured


def workload_at_ref(path: Path, ref: str, dest: Path) -> Path:
    """Extract the workload's folder as it was at git `ref` into `dest`; return the workload file's path there.

    `git archive` reads the object store only: the user's checkout, index and worktree list stay untouched.
    The whole folder comes along so sibling modules the workload imports match the ref too.
    """
    path = Path(path)
    folder = path.resolve().parent

    def git(*args: str, binary: bool = False):
        try:
            return subprocess.run(["git", "-C", str(folder), *args], capture_output=True, check=False,
                                  text=not binary, timeout=120)
        except FileNotFoundError:
            raise UsageError("--against needs git, and git is not installed here") from None

    top = git("rev-parse", "--show-prefix")
    if top.returncode != 0:
        raise UsageError(f"--against {ref}: {path} is not inside a git repository")
    prefix = top.stdout.strip()  # the folder relative to the repository root, with a trailing '/'
    if git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").returncode != 0:
        raise UsageError(f"--against {ref}: no such commit, branch or tag in this repository. In GitHub Actions, "
                         f"fetch it first (actions/checkout with fetch-depth: 0, or git fetch origin {ref})")
    inside = f"{prefix}{path.name}"
    if git("cat-file", "-e", f"{ref}:{inside}").returncode != 0:
        raise UsageError(f"--against {ref}: {inside} does not exist at {ref}; gate against a ref that has the "
                         f"workload file, or record a baseline instead")
    archive = git("archive", "--format=tar", ref, "--", prefix or ".", binary=True)
    if archive.returncode != 0:
        raise UsageError(f"--against {ref}: git archive failed: {archive.stderr.decode(errors='replace').strip()}")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        try:
            tar.extractall(dest, filter="data")  # refuses absolute paths and links out of dest
        except TypeError:  # pragma: no cover - Python without extraction filters
            tar.extractall(dest)
    return dest / inside
