"""How the loader, optimizer and compile knobs are applied (probe/apply.py), on real torch objects."""

import pytest
import torch

from tune_advisor import knobs
from tune_advisor.probe import apply


def test_worker_only_loader_arguments_appear_only_with_workers():
    settings = knobs.full_settings({"num_workers": 0, "persistent_workers": True, "prefetch_factor": 4})
    assert "persistent_workers" not in apply.loader_kwargs(settings, "cpu")
    with_workers = apply.loader_kwargs({**settings, "num_workers": 2}, "cpu")
    assert with_workers["persistent_workers"] is True and with_workers["prefetch_factor"] == 4
    # AND the DataLoader accepts both sets of arguments
    data = torch.utils.data.TensorDataset(torch.zeros(8, 2))
    for kwargs in (apply.loader_kwargs(settings, "cpu"), with_workers):
        torch.utils.data.DataLoader(data, **kwargs)


@pytest.mark.parametrize("impl", ["foreach", "fused"])
def test_optimizer_rebuilt_with_the_implementation_keeps_groups_and_hyperparameters(impl):
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    groups = [{"params": model[0].parameters(), "lr": 0.1}, {"params": model[1].parameters()}]
    original = torch.optim.AdamW(groups, lr=0.01, weight_decay=0.2, betas=(0.8, 0.9))
    rebuilt = apply.optimizer_impl(original, impl)
    assert type(rebuilt) is torch.optim.AdamW
    assert [g["lr"] for g in rebuilt.param_groups] == [0.1, 0.01]
    assert all(g["weight_decay"] == 0.2 and g["betas"] == (0.8, 0.9) for g in rebuilt.param_groups)
    assert all(g[impl] is True for g in rebuilt.param_groups)
    other = "fused" if impl == "foreach" else "foreach"
    assert all(not g[other] for g in rebuilt.param_groups)
    # AND it trains: one step changes the weights
    before = model[0].weight.detach().clone()
    model(torch.randn(3, 4)).sum().backward()
    rebuilt.step()
    assert not torch.equal(before, model[0].weight)


def test_default_leaves_the_users_optimizer_untouched():
    opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    assert apply.optimizer_impl(opt, "default") is opt


def test_supported_implementations_are_the_ones_that_build_here():
    params = list(torch.nn.Linear(2, 2).parameters())
    assert apply.supported_optimizer_impls(torch.optim.AdamW(params)) == ["foreach", "fused"]

    class Custom(torch.optim.Optimizer):  # a user's optimizer without either switch
        def __init__(self, params, lr=0.1):
            super().__init__(params, {"lr": lr})

    assert apply.supported_optimizer_impls(Custom(params)) == []


def test_compile_off_returns_the_model_and_a_mode_wraps_it():
    model = torch.nn.Linear(2, 2)
    assert apply.compile_model(model, knobs.full_settings()) is model
    compiled = apply.compile_model(model, knobs.full_settings({"compile": "default"}))
    assert compiled is not model and compiled._orig_mod is model  # compiled lazily, at the first call


def test_compiles_precompiled_headers_go_to_the_compile_cache_not_the_probes_scratch_folder(tmp_path, monkeypatch):
    from torch._inductor import codecache

    # as in a probe child: inductor placed them under tempfile.gettempdir(), the probe's scratch TMPDIR
    monkeypatch.setattr(codecache, "_HEADER_DIR", str(tmp_path / "scratch" / "torchinductor_u" / "precompiled_headers"))
    monkeypatch.setattr(codecache, "_HEADER_LOCK_DIR", codecache._HEADER_DIR + "/locks")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cache"))
    apply.share_compile_headers()
    assert codecache._HEADER_DIR == str(tmp_path / "cache" / "precompiled_headers")
    assert codecache._HEADER_LOCK_DIR == str(tmp_path / "cache" / "precompiled_headers" / "locks")


def test_matmul_precision_is_set_process_wide():
    try:
        apply.configure_backends(knobs.full_settings({"matmul_precision": "high"}), "cpu")
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision("highest")
