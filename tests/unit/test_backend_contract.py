"""Every ProbeBackend (probe/backend.py) against the one contract the Session relies on: the tests' fake, the local
backend (real child probes of a tiny workload), torchrun (a DDP job of two gloo ranks) and Ray (tasks of a local
Ray instance). A torchrun probe takes about 6 s here, so torchrun runs one: `many` is LocalBackend's, checked
there."""

from __future__ import annotations

import pytest

from tune_advisor import knobs
from tune_advisor.distributed.launch import layout
from tune_advisor.executors.local import LocalBackend, TorchrunBackend
from tune_advisor.probe import lockstep
from tune_advisor.probe.backend import ProbeBackend
from tune_advisor.probe.result import ProbeResult, Status
from tune_advisor.probe.spec import ProbeSpec

from ..conftest import FAST, WORKLOADS
from ..fakes import FakeBackend

KINDS = ["fake", "local", "torchrun", "ray"]
PAIRS = ["fake", "local"]  # the others refuse a pair (can_pair False): checked below
RUNS_MANY = ["fake", "local", "ray"]  # torchrun's many is LocalBackend's, checked there


def spec(probe_id: str, batch_size: int = 16, kind: str = "local") -> ProbeSpec:
    return ProbeSpec(id=probe_id, workload=str(WORKLOADS / "tiny_mlp.py"), device="cpu", protocol=FAST,
                     settings=knobs.full_settings({"batch_size": batch_size}), timeout_s=60.0,
                     distributed=layout(2) if kind == "torchrun" else None)


@pytest.fixture(scope="module")
def local_ray():
    import ray  # the README's test install has the ray extra: a missing one fails here, it does not skip
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(params=KINDS)
def kind(request) -> str:
    return request.param


@pytest.fixture
def backend(kind, tmp_path, request):
    if kind == "fake":
        made = FakeBackend(lambda s: 1000.0, pair_memory_bytes=2**30)
    elif kind == "local":
        made = LocalBackend(tmp_path, pair_memory_bytes=2**30)
    elif kind == "torchrun":
        made = TorchrunBackend(tmp_path)
    else:
        request.getfixturevalue("local_ray")
        from tune_advisor.executors.ray import RayBackend

        made = RayBackend(None, "cpu", tmp_path)
    yield made
    made.close()


def test_it_says_how_many_probes_it_runs_at_once_whether_it_pairs_and_in_how_much_memory(backend):
    assert isinstance(backend, ProbeBackend)
    assert isinstance(backend.width, int) and backend.width >= 1
    assert isinstance(backend.can_pair, bool)
    assert backend.pair_memory_bytes is None or backend.pair_memory_bytes > 0
    assert isinstance(backend.fresh_parent_s, float) and backend.fresh_parent_s >= 0  # what a new zygote costs


@pytest.mark.parametrize("kind", sorted(set(KINDS) - set(PAIRS)))
def test_a_backend_that_cannot_pair_refuses_a_pair(backend):
    assert not backend.can_pair
    assert backend.pair_memory_bytes is None  # no pairs, no memory to share between two
    with pytest.raises(NotImplementedError):
        backend.pair([spec("p001"), spec("p002", 32)], ["recheck", "knob:batch_size"], 0)


def test_run_returns_the_result_of_that_spec(backend, kind):
    asked = spec("p001", kind=kind)
    result = backend.run(asked, "baseline")
    assert isinstance(result, ProbeResult) and result.status is Status.OK, result.error
    assert (result.id, result.role, result.settings) == ("p001", "baseline", asked.settings)
    assert result.measured and result.paired_with is None
    if kind == "torchrun":  # the spec's layout reached torchrun
        assert result.extra["distributed"]["world_size"] == 2


@pytest.mark.parametrize("kind", RUNS_MANY)
def test_many_yields_one_result_per_job_each_as_its_own(backend):
    jobs = [(spec("p002"), "grid"), (spec("p003", 32), "grid")]
    results = {r.id: r for r in backend.many(jobs)}
    assert sorted(results) == ["p002", "p003"]
    for asked, role in jobs:
        got = results[asked.id]
        assert got.status is Status.OK and got.role == role and got.settings == asked.settings, got.error


@pytest.mark.parametrize("kind", PAIRS)
def test_a_pair_is_measured_together_and_returned_in_the_order_asked(backend):
    assert backend.can_pair
    a, b = backend.pair([spec("p004"), spec("p005", 32)], ["recheck", "knob:batch_size"], first=1)
    assert (a.id, a.role, a.settings["batch_size"]) == ("p004", "recheck", 16)
    assert (b.id, b.role, b.settings["batch_size"]) == ("p005", "knob:batch_size", 32)
    assert a.status is Status.OK and b.status is Status.OK, (a.error, b.error)
    # each knows its partner and which side moved first; both took as many turns, side by side (a turn is one step,
    # or several of a side whose steps are much shorter: probe/lockstep.py), and the turns hold every measured step
    assert (a.paired_with, b.paired_with) == ("p005", "p004")
    assert (a.extra["lockstep"]["first"], b.extra["lockstep"]["first"]) == (False, True)
    turns = [lockstep.turns_of(a), lockstep.turns_of(b)]
    assert None not in turns and len(turns[0]) == len(turns[1]) > 0
    assert [sum(t) for t in turns] == [len(a.step_s), len(b.step_s)]
