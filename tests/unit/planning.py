"""Shared cases for the planner's tests: device and workload facts, a synthetic CNN, and one planned run against
a FakeBackend on a fake clock."""

from tune_advisor import knobs
from tune_advisor.knobs import DeviceFacts, WorkloadFacts
from tune_advisor.planner import PlanContext, Session, plan
from tune_advisor.probe.result import Status

from ..fakes import FakeBackend, FakeClock

CPU = DeviceFacts("cpu", bf16_supported=True)
CPU_NO_BF16 = DeviceFacts("cpu", bf16_supported=False)
CPU_AMP_ONLY = DeviceFacts("cpu", bf16_supported=True, compile_unavailable="not part of this test")
CNN = WorkloadFacts(conv_layers=4, repeated_blocks="blocks: 2 x Block", dataset_len=10_000)
MLP = WorkloadFacts(dataset_len=10_000)
BLOCKS = WorkloadFacts(repeated_blocks="layers: 4 x Block", dataset_len=10_000)
FUSED_MLP = WorkloadFacts(dataset_len=10_000, optimizer_class="AdamW", optimizer_impls=("foreach", "fused"))


def run_plan(rate, workload=CNN, search=None, baseline=None, budget_s=None, memory=None, device=CPU,
             strategy="adaptive", jitter=0.02, moment=None, lockstep=False, explore=None, pair_memory=None,
             fresh_parent_s=0.0, train_steps=None, wall_s=5.0, workload_sha256=None):
    # `lockstep`: the backend measures pairs together, as analyze's local one does (probe/lockstep.py);
    # `fresh_parent_s`: what a probe forked from a new parent costs it (backend.fresh_parent_s); `wall_s`: a
    # probe's wall time
    clock = FakeClock()
    backend = FakeBackend(rate, jitter=jitter, moment=moment, clock=clock, can_pair=lockstep,
                          pair_memory_bytes=pair_memory, wall_s=wall_s)
    backend.fresh_parent_s = fresh_parent_s
    session = Session(backend, budget_s, clock=clock)
    ctx = PlanContext(baseline=knobs.full_settings(baseline or {"batch_size": 16}), search=search or {},
                      workload=workload, device=device, memory_budget_bytes=memory, explore=explore,
                      train_steps=train_steps, workload_sha256=workload_sha256)
    return plan(ctx, session, strategy), backend


def cnn_rate(s):
    """bf16 1.5x, channels_last 1.2x, throughput climbs with batch up to 64, OOM from 256, workers useless."""
    if s["batch_size"] >= 256:
        return Status.OOM
    rate = 1000.0 * (1.5 if s["amp"] == "bf16" else 1) * (1.2 if s["channels_last"] else 1)
    rate *= min(1.7, 1 + 0.7 * (s["batch_size"] - 16) / 48)  # 1x at 16 ... 1.7x from 64 up
    return rate * (0.7 if s["checkpointing"] else 1)
