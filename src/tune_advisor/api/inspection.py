"""The workload file as a child process loads it (`inspect_workload`), and the device facts the knobs depend on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import environment, frameworks, hardware, knobs
from .. import workload as workload_mod
from ..errors import WorkloadError
from ..probe.runner import classify_exit, spawn_child
from ..probe.spec import ProbeSpec

INSPECT_TIMEOUT_S = 300.0


@dataclass
class Inspection:
    """What the inspect child found in the workload file."""

    path: Path
    facts: knobs.WorkloadFacts
    baseline: dict[str, Any]  # every knob: defaults overlaid with the file's BASELINE
    search: dict[str, list]
    item_name: str
    optional: list[str]
    framework: dict[str, Any] | None = None  # a Trainer or LightningModule handed over (frameworks/)
    # script mode: the spec's `script` (probe/spec.py) with the script's own settings and its training loader
    script: dict[str, Any] | None = None

    @property
    def preload(self) -> list[str]:
        """What its probes' parent process imports for them (ProbeSpec.preload): a framework's modules."""
        return frameworks.modules(self.framework, self.path)


def inspect_workload(path: str | Path, device: str, workdir: Path,
                     timeout_s: float = INSPECT_TIMEOUT_S, script: dict[str, Any] | None = None,
                     as_workload: bool = False) -> Inspection:
    """Load and check the workload in a child process. Raises WorkloadError (exit 2) for every load problem.
    `script`: a plain script (script mode), run to its first optimizer steps as `python FILE ARGS` would. Without
    it, a file workload.is_script takes for a script is refused before it runs (it would train at import), unless
    `as_workload` (--workload, or analyze's own decision)."""
    shown = str(path)
    resolved = workload_mod.check_file(path)
    if script is None and not as_workload and workload_mod.is_script(resolved):
        raise WorkloadError(shown, "is a plain training script (no build_model() the tool can call with no "
                                   "arguments, or a __main__ block that trains), and this command measures workload "
                                   "files", f"analyse it as a script: tune-advisor analyze {shown} -- ARGS; or, if it "
                                            "is a workload file, load it as one with --workload")
    # a framework's modules as its probes' (Inspection.preload): imported once, by the zygote, for the inspection too
    preload = [] if script else frameworks.modules({"name": workload_mod.framework_of(resolved)}, resolved)
    spec = ProbeSpec(id="inspect", workload=str(resolved), settings=knobs.full_settings(), device=device,
                     timeout_s=timeout_s, mode="inspect", script=script, preload=preload)
    run = spawn_child(spec, workdir)
    result = _inspected(shown, spec, run, script is not None)
    seen = dict(path=resolved, facts=knobs.WorkloadFacts(**result["facts"]),
                baseline=knobs.full_settings(result["baseline"]), search=result["search"],
                item_name=result["item_name"])
    if script is None:
        return Inspection(**seen, optional=result["optional"], framework=result.get("framework"))
    loader = result["script"].get("loader") or {}
    # torchrun_env: a script that reads torchrun's variables itself runs with those of a world of one
    return Inspection(**seen, optional=[], script={**script, "baseline": seen["baseline"],
                                                   "loader_site": loader.get("site"),
                                                   "torchrun_env": bool(result["script"].get("torchrun_env"))})


def _inspected(shown: str, spec: ProbeSpec, run, is_script: bool) -> dict[str, Any]:
    """The inspect child's result, or WorkloadError: what was seen (of a workload's loading or a script's run
    to its first optimizer steps) and what to do."""
    if run.timed_out:
        if not is_script:
            raise WorkloadError(shown, f"loading the workload took longer than {spec.timeout_s:g} s "
                                       f"(stuck while {run.phase or 'starting'})",
                                "make build_model()/build_dataset() fast")
        before = "before its first optimizer step" in run.phase or not run.phase
        stage = ("was still running before its first optimizer step" if before else
                 f"did not get through its first optimizer steps ({run.phase})")
        raise WorkloadError(shown, f"the script {stage} after {spec.timeout_s:g} s, the probe limit; its process "
                                   "group was killed", "make it reach its training loop sooner (e.g. less data "
                                                       "preparation), or raise --probe-timeout")
    if run.result is None:
        _, cause = classify_exit(run, spec)
        if is_script:
            raise WorkloadError(shown, f"the process running the script {cause}",
                                "run the script on its own with the same arguments to find the fault")
        raise WorkloadError(shown, f"the process loading the workload {cause}",
                            "run build_model() and build_dataset() by hand to find the fault")
    if run.result.get("status") == "load_error":
        error = run.result["error"]
        raise WorkloadError(shown, error["cause"], error["fix"], line=error.get("line"))
    return run.result


def device_facts(device: str) -> knobs.DeviceFacts:
    """What decides which knobs apply on `device`; bf16 counts only where the hardware computes it natively
    (emulated, autocast still runs but many times slower: probing it would only spend the budget)."""
    import torch

    bf16 = hardware.native_types(device).bf16
    if device.startswith("cuda"):
        dev = torch.device(device)
        return knobs.DeviceFacts("cuda", torch.cuda.get_device_name(dev), bf16.native, bf16.reason,
                                 tf32=torch.cuda.get_device_capability(dev) >= (8, 0),
                                 compile_unavailable=environment.compile_unavailable("cuda"),
                                 cpu_cores=environment.usable_cores())
    return knobs.DeviceFacts("cpu", environment.cpu_model(), bf16.native, bf16.reason,
                             compile_unavailable=environment.compile_unavailable("cpu"),
                             cpu_cores=environment.usable_cores())
