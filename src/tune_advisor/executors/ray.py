"""`--executor ray`: probes as Ray tasks, on an existing Ray cluster (`--ray-address`) or a local Ray instance.

Each task calls the ordinary single-probe runner (`probe.runner.run_probe`) on the node Ray picks, so a probe is
measured there exactly as it would be here: its own child process (or torchrun job), wall-clock limit, kill, status.
A task asks Ray for one GPU on CUDA (a DDP probe: one per local rank) and none on the CPU. Independent probes (the
grid's combinations) are submitted together where the cluster runs several at once (`width`), and come back as
each finishes (`ray.wait`), straight into results.json; probes that depend on earlier ones (the adaptive planner's,
the interleaved confirmation) go one at a time.
"""

from __future__ import annotations

import socket
import tempfile
from pathlib import Path
from typing import Iterator

from ..errors import UsageError
from ..probe.backend import Job
from ..probe.result import ProbeResult, Status
from ..probe.runner import ZYGOTE_START_S
from ..probe.spec import ProbeSpec

INSTALL_HINT = "pip install 'tune-advisor[ray]'"


def run_task(spec: ProbeSpec, workdir: str, role: str) -> ProbeResult:
    """Body of one Ray task: run the probe on this node with the ordinary runner."""
    from ..distributed.launch import TORCHRUN
    from ..probe.runner import run_probe

    node = socket.gethostname()
    if not Path(spec.workload).is_file():
        return ProbeResult(spec.id, dict(spec.settings), Status.ERROR, role=role, seed=spec.seed,
                           error=f"the workload file {spec.workload} is not on Ray node {node}: put it (and what it "
                                 "imports) on a filesystem every node shares, at the same path")
    folder = Path(workdir)
    if not folder.parent.is_dir():  # another machine: the probe's files stay there, its result comes back
        folder = Path(tempfile.mkdtemp(prefix="tune-advisor-"))
    result = run_probe(spec, folder, role=role, launcher=TORCHRUN if spec.distributed else None)
    result.extra["executor"] = {"name": "ray", "node": node}
    return result


class RayBackend:
    """Submits probes as Ray tasks; `width` is how many the cluster runs side by side. Never paired: the two sides
    of a lockstep pair must be children of one process on one machine."""

    can_pair = False
    pair_memory_bytes = None
    fresh_parent_s = ZYGOTE_START_S  # each task runs its probe as a local child (probe/runner.py) on its node

    def __init__(self, address: str | None, device: str, workdir: Path):
        try:
            import ray
        except ImportError:
            raise UsageError(f"--executor ray needs Ray, which is not installed here: {INSTALL_HINT}") from None
        self.ray, self.cuda, self.workdir = ray, device.startswith("cuda"), Path(workdir)
        self.started_here = not ray.is_initialized()
        if self.started_here:
            try:
                # address None starts a local instance (or joins $RAY_ADDRESS); "auto" joins the cluster of this node
                ray.init(address=address, include_dashboard=False, log_to_driver=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise UsageError(f"--executor ray: cannot connect to the Ray cluster at {address}: {exc}") from None
        # A failed probe is a result, not something for Ray to retry.
        self.task = ray.remote(max_retries=0)(run_task)

    def _gpus(self, spec: ProbeSpec) -> int:
        return (spec.distributed or {}).get("nproc_per_node", 1) if self.cuda else 0

    @property
    def width(self) -> int:
        """Probes the cluster can run at once: GPUs per probe on CUDA, one CPU per probe on the CPU."""
        resources = self.ray.cluster_resources()
        return max(1, int(resources.get("GPU", 0)) if self.cuda else int(resources.get("CPU", 1)))

    def submit(self, spec: ProbeSpec, role: str):
        return self.task.options(num_gpus=self._gpus(spec), num_cpus=1, name=f"probe {spec.id}").remote(
            spec, str(self.workdir), role)

    def run(self, spec: ProbeSpec, role: str) -> ProbeResult:
        return next(self.many([(spec, role)]))

    def pair(self, specs: list[ProbeSpec], roles: list[str], first: int) -> list[ProbeResult]:
        raise NotImplementedError("Ray tasks are not measured in lockstep pairs")

    def many(self, jobs: list[Job]) -> Iterator[ProbeResult]:
        """Submit every job now; yield each result as its task finishes. Unfinished tasks are cancelled when the
        caller stops early (Ctrl-C)."""
        pending = {self.submit(spec, role): (spec, role) for spec, role in jobs}
        try:
            while pending:
                done, _ = self.ray.wait(list(pending), num_returns=1)
                spec, role = pending.pop(done[0])
                yield self._get(done[0], spec, role)
        finally:
            for ref in pending:
                self.ray.cancel(ref, force=True)

    def _get(self, ref, spec: ProbeSpec, role: str) -> ProbeResult:
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayError as exc:  # the task's worker died, the node was lost, ...
            cause = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
            return ProbeResult(spec.id, dict(spec.settings), Status.CRASHED, role=role, seed=spec.seed,
                               error=f"the Ray task running the probe failed: {cause}")

    def close(self) -> None:
        """Shut down the local Ray instance started here (a cluster, or an instance the caller started, stays)."""
        if self.started_here and self.ray.is_initialized():
            self.ray.shutdown()
