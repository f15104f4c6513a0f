"""The Lightning adapter: the baseline read from the module's DataLoader and TRAINER_ARGS, the loss from
training_step, the optimizer from configure_optimizers, the recommendation written as Trainer(...) and
DataLoader(...) arguments, and every way a build_module() file can be wrong (exit 2, the file and the fix named)."""

import sys
import textwrap

import pytest
import torch

from tune_advisor import knobs, workload
from tune_advisor.errors import WorkloadError
from tune_advisor.frameworks import OptimizerStep, lightning, lightning_loop
from tune_advisor.render import view

from ..conftest import BAD, FIXTURES, WORKLOADS, golden
from ..fakes import StopAfter

HEADER = """\
    import lightning as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset


    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(4, 2)

        def training_step(self, batch, batch_idx):
            x, y = batch
            return {"loss": torch.nn.functional.cross_entropy(self.layer(x), y)}

        def configure_optimizers(self):
            OPTIMIZERS

        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,))), LOADER)


    def build_module():
        return Module()
    """


def write(tmp_path, optimizers="return torch.optim.SGD(self.parameters(), lr=0.1)", loader="batch_size=8",
          extra=""):
    path = tmp_path / "workload.py"
    text = textwrap.dedent(HEADER).replace("OPTIMIZERS", optimizers).replace("LOADER", loader)
    path.write_text(text + textwrap.dedent(extra))
    return path


def test_the_fixture_loads_as_a_lightning_workload():
    # WHEN the shipped fixture, which defines only build_module(), is loaded
    wl = workload.load(FIXTURES / "lightning_module.py")
    # THEN the baseline is its DataLoader's and TRAINER_ARGS' settings
    assert wl.framework["name"] == "lightning"
    assert wl.baseline == {"batch_size": 16, "num_workers": 0, "pin_memory": False, "amp": "off",
                           "cudnn_benchmark": False}
    assert wl.framework["config"]["trainer_args"]["precision"] == "32-true"
    # AND the model trained is the module's training step; the reports name the user's class
    model = wl.call("build_model")
    assert model.user_class == "SmallCNN"
    dataset = wl.call("build_dataset")
    batch = wl.collate_fn([dataset[0], dataset[1]])
    loss = wl.compute_loss(model, batch)
    images, labels = batch
    assert torch.allclose(loss, torch.nn.functional.cross_entropy(model.module(images), labels))
    # AND the optimizer is configure_optimizers()'s, over the module's parameters
    optimizer = wl.call("build_optimizer", model.parameters())
    assert isinstance(optimizer, torch.optim.AdamW)
    assert {id(p) for g in optimizer.param_groups for p in g["params"]} == {id(p) for p in model.parameters()}


@pytest.mark.parametrize("loader, trainer_args, expected", [
    ("batch_size=8", "", {"batch_size": 8, "num_workers": 0, "amp": "off"}),
    ("batch_size=4, num_workers=2, prefetch_factor=3, persistent_workers=True, pin_memory=True", "",
     {"batch_size": 4, "num_workers": 2, "prefetch_factor": 3, "persistent_workers": True, "pin_memory": True}),
    ("batch_size=8", "TRAINER_ARGS = {'precision': 'bf16-mixed', 'benchmark': True}\n",
     {"amp": "bf16", "cudnn_benchmark": True}),
    ("batch_size=8", "TRAINER_ARGS = {'precision': '16-mixed'}\n", {"amp": "fp16"}),
])
def test_the_dataloader_and_trainer_args_become_the_baseline(tmp_path, loader, trainer_args, expected):
    wl = workload.load(write(tmp_path, loader=loader, extra=trainer_args))
    assert expected.items() <= wl.baseline.items()


@pytest.mark.parametrize("trainer_args, expected", [
    ("", OptimizerStep(batch_size=8)),
    ("TRAINER_ARGS = {'accumulate_grad_batches': 4, 'gradient_clip_val': 0.5}\n",
     OptimizerStep(batch_size=8, accumulate=4, clip_value=0.5, clip="norm")),
    ("TRAINER_ARGS = {'gradient_clip_val': 2, 'gradient_clip_algorithm': 'value'}\n",
     OptimizerStep(batch_size=8, clip_value=2.0, clip="value")),
])
def test_the_probe_steps_the_optimizer_as_lightnings_trainer_does(tmp_path, trainer_args, expected):
    assert workload.load(write(tmp_path, extra=trainer_args)).optimizer_step == expected


def test_a_module_of_the_older_pytorch_lightning_package_is_accepted(tmp_path):
    path = write(tmp_path).read_text().replace("import lightning as L", "import pytorch_lightning as L")
    (tmp_path / "workload.py").write_text(path)
    assert workload.load(tmp_path / "workload.py").framework["name"] == "lightning"


@pytest.mark.parametrize("optimizers", [
    "return torch.optim.SGD(self.parameters(), lr=0.1)",
    "return [torch.optim.SGD(self.parameters(), lr=0.1)]",
    "opt = torch.optim.SGD(self.parameters(), lr=0.1)\n        return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1)]",
    "opt = torch.optim.SGD(self.parameters(), lr=0.1)\n        return {'optimizer': opt, 'lr_scheduler': "
    "torch.optim.lr_scheduler.StepLR(opt, 1)}",
])
def test_every_form_of_configure_optimizers_gives_its_optimizer(tmp_path, optimizers):
    wl = workload.load(write(tmp_path, optimizers=optimizers))
    assert isinstance(wl.call("build_optimizer", None), torch.optim.SGD)


def test_a_datamodule_beside_the_module_gives_the_data(tmp_path):
    path = write(tmp_path, extra="""

        class Data(L.LightningDataModule):
            def setup(self, stage):
                self.train = TensorDataset(torch.randn(40, 4), torch.randint(0, 2, (40,)))

            def train_dataloader(self):
                return DataLoader(self.train, batch_size=5, num_workers=1)


        def build_datamodule():
            return Data()
        """)
    wl = workload.load(path)
    assert wl.baseline["batch_size"] == 5 and wl.baseline["num_workers"] == 1
    assert len(wl.call("build_dataset")) == 40


def test_a_module_with_manual_optimization_and_two_optimizers_trains_in_lightnings_loop(tmp_path):
    # GIVEN a GAN: automatic_optimization = False, self.optimizers(), manual_backward, two optimizers
    wl = workload.load(WORKLOADS / "tiny_gan.py")
    assert wl.framework["config"]["automatic_optimization"] is False
    probe = StopAfter(3)
    # WHEN a probe runs the framework's own loop at a batch of 64
    applied = wl.loop.run(knobs.full_settings({**wl.baseline, "batch_size": 64}), "cpu", probe, tmp_path)
    # THEN Lightning's Trainer ran its training_step, both optimizers stepping, until the probe stopped it; the
    # batch went to the DataLoader, and no accumulation was asked of a module that steps by itself
    module = wl.loop.run.args[2]
    assert len(module.trainer.optimizers) == 2 and module.trainer.global_step == 6  # each optimizer 3 times
    assert applied["dataloader_arguments"] == {"batch_size": 64, "num_workers": 0, "pin_memory": False}
    assert "accumulate_grad_batches" not in applied["trainer_arguments"]
    assert probe.started_with[:2] == (1, 1) and probe.started_with[2].batch_size == 64
    assert len(probe.losses) == 3 and all(loss > 0 for loss in probe.losses)


def test_a_module_that_reads_its_trainer_and_steps_its_schedule_each_step(tmp_path):
    # GIVEN a module whose configure_optimizers reads self.trainer and whose schedule steps every step,
    # with accumulate_grad_batches=2 in TRAINER_ARGS
    wl = workload.load(WORKLOADS / "tiny_scheduled.py")
    probe = StopAfter(4)
    # WHEN a probe runs at twice the batch
    applied = wl.loop.run(knobs.full_settings({**wl.baseline, "batch_size": 64}), "cpu", probe, tmp_path)
    # THEN the effective batch of 64 is kept (accumulation 2 → 1) and the scheduler stepped with each step
    assert applied["trainer_arguments"]["accumulate_grad_batches"] == 1 and probe.started_with[0] == 1
    module = wl.loop.run.args[2]
    schedule = module.trainer.lr_scheduler_configs[0].scheduler
    assert module.trainer.global_step == 4 and schedule.last_epoch == 4


def test_inspection_runs_one_step_of_lightnings_own_loop(tmp_path):
    # a step by hand outside a Trainer cannot run a module that reads its Trainer: inspection runs Lightning's
    wl = workload.load(WORKLOADS / "tiny_scheduled.py")
    wl.loop.first_step("cpu")
    assert isinstance(wl.call("build_optimizer", None), torch.optim.AdamW)


def test_a_manual_optimization_module_is_not_advised_an_accumulation_lightning_refuses_it():
    config = {"trainer_args": {"precision": "32-true"}, "automatic_optimization": False}
    base, recommended = {"batch_size": 32}, {"batch_size": 64}
    assert "accumulate_grad_batches" not in lightning.recommendation(base, recommended, config)
    note = lightning.batch_note(base, recommended, config)
    assert "manual optimization" in note and "scale the learning rate about 2x" in note


@pytest.mark.parametrize("settings, trainer, loader, code", [
    ({"amp": "bf16", "cudnn_benchmark": True}, {"precision": "bf16-mixed", "benchmark": True}, {}, []),
    ({"num_workers": 2, "persistent_workers": True}, {}, {"num_workers": 2, "persistent_workers": True}, []),
    ({"num_workers": 0, "persistent_workers": True}, {}, {"num_workers": 0}, []),
    ({"compile": "default", "channels_last": True}, {}, {}, ["compile", "channels_last"]),
])
def test_a_probes_settings_become_trainer_and_dataloader_arguments(settings, trainer, loader, code):
    found = lightning_loop.settings_split(lightning.arguments, knobs.full_settings({"batch_size": 8, **settings}))
    assert trainer.items() <= found[0].items() and loader.items() <= found[1].items()
    assert set(code) <= set(found[2])


def test_the_recommendation_is_trainer_and_dataloader_arguments():
    base = knobs.full_settings({"batch_size": 32})
    rec = {**base, "amp": "bf16", "num_workers": 4, "batch_size": 64, "matmul_precision": "medium"}
    text = lightning.recommendation(base, rec, {"trainer_args": {"precision": "32-true",
                                                                 "accumulate_grad_batches": 2}})
    trainer, rest = text.split("# DataLoader(...) in train_dataloader(): change these arguments")
    assert '- precision="32-true",\n+ precision="bf16-mixed",' in trainer
    assert "+ accumulate_grad_batches=1,  # keeps the effective batch of 64" in trainer
    loader, code = rest.split("# and in your code:")
    assert "- batch_size=32,\n+ batch_size=64," in loader and "+ num_workers=4," in loader
    assert 'torch.set_float32_matmul_precision("medium")' in code


@pytest.mark.parametrize("knob, value, where, expected", [
    ("amp", "fp16", "trainer", {"precision": "16-mixed"}),
    ("cudnn_benchmark", True, "trainer", {"benchmark": True}),
    ("pin_memory", True, "loader", {"pin_memory": True}),
    ("compile", "max-autotune", "code", 'torch.compile(model, mode="max-autotune")'),
    ("checkpointing", True, "code", "torch.utils.checkpoint.checkpoint(block"),
    ("channels_last", True, "code", "on_fit_start"),
    ("optimizer_impl", "fused", "code", "fused=True"),
])
def test_each_knob_maps_to_an_argument_or_to_code(knob, value, where, expected):
    found_where, found = lightning.arguments(knob, value)
    assert found_where == where
    assert found == expected if isinstance(expected, dict) else expected in found


def test_the_report_writes_the_recommendation_as_lightning_arguments():
    doc = golden("cnn")
    doc["workload"]["framework"] = {"name": "lightning", "config": {"trainer_args": {}}}
    report = view.build(doc)
    assert report.snippet and ("# Trainer(...)" in report.snippet or "# DataLoader(...)" in report.snippet)
    assert ("framework", "Lightning (build_module)") in report.workload


# --- errors: exit code 2, the file and the fix ---------------------------------------------------------------------

@pytest.mark.parametrize("name, expected", [
    ("lightning_no_loss.py", ["lightning_no_loss.py:13", "training_step() returned None, not a loss",
                              "fix: return the loss tensor"]),
    ("lightning_not_a_module.py", ["build_module() returned a Linear, not a lightning LightningModule"]),
    ("lightning_no_dataloader.py", ["defines no train_dataloader()", "fix: define train_dataloader()"]),
])
def test_an_unusable_module_exits_2_naming_the_file_and_the_fix(cli, name, expected):
    result = cli("probe", BAD / name, "--device", "cpu")
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert name in text and all(fragment in text for fragment in expected)
    assert "Traceback" not in result.output


def test_build_module_that_is_not_a_function(tmp_path):
    path = tmp_path / "workload.py"
    path.write_text("build_module = None\n")
    with pytest.raises(WorkloadError, match="build_module is a NoneType, not a function"):
        workload.load(path)


@pytest.mark.parametrize("optimizers, loader, extra, cause", [
    ("return None", "batch_size=8", "", "returns no optimizer"),
    ("return torch.optim.SGD(self.parameters(), lr=0.1)", "batch_sampler=[[0, 1], [2, 3]]", "", "batch_sampler"),
    ("return torch.optim.SGD(self.parameters(), lr=0.1)", "batch_size=8", "TRAINER_ARGS = {'precision': 'bf16-true'}\n",
     "precision='bf16-true' is not one the advisor probes"),
    ("return torch.optim.SGD(self.parameters(), lr=0.1)", "batch_size=8",
     "TRAINER_ARGS = {'gradient_clip_algorithm': 'max'}\n", "gradient_clip_algorithm='max' is not one Lightning"),
    ("return torch.optim.SGD(self.parameters(), lr=0.1)", "batch_size=8",
     "TRAINER_ARGS = {'gradient_clip_val': 'big'}\n", "gradient_clip_val='big' is not a number"),
])
def test_modules_the_advisor_cannot_time_are_refused(tmp_path, optimizers, loader, extra, cause):
    wl_path = write(tmp_path, optimizers=optimizers, loader=loader, extra=extra)
    with pytest.raises(WorkloadError) as caught:
        wl = workload.load(wl_path)
        wl.call("build_optimizer", None)
    assert cause in str(caught.value)


def test_lightning_not_installed_names_the_extra(monkeypatch, tmp_path):
    for package in ("lightning", "lightning.pytorch", "pytorch_lightning"):  # either would do; all are cached
        monkeypatch.setitem(sys.modules, package, None)
    path = tmp_path / "workload.py"
    path.write_text("def build_module():\n    pass\n")
    with pytest.raises(WorkloadError, match="needs the 'lightning' package") as caught:
        workload.load(path)
    assert "pip install 'tune-advisor[lightning]'" in caught.value.fix
    path.write_text("import lightning as L\n\ndef build_module():\n    pass\n")
    with pytest.raises(WorkloadError, match="cannot import") as caught:
        workload.load(path)
    assert "pip install 'tune-advisor[lightning]'" in caught.value.fix


def test_lightning_not_installed_exits_2_through_the_cli(cli, tmp_path):
    # GIVEN packages beside the workload that shadow both Lightning packages and fail to import, as missing ones do
    for package in ("lightning", "pytorch_lightning"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text(f"raise ImportError('{package} is not installed')\n")
    path = tmp_path / "workload.py"
    path.write_text("def build_module():\n    pass\n")
    result = cli("probe", path, "--device", "cpu")
    assert result.exit_code == 2, result.output
    assert "pip install 'tune-advisor[lightning]'" in result.output and "Traceback" not in result.output


def test_reports_of_framework_runs_render_without_torch(tmp_path):
    # WHEN the example reports of both framework fixtures are re-rendered in a fresh interpreter
    import subprocess

    from ..conftest import ROOT

    for name in ("hf_trainer", "lightning_module"):
        code = ("import sys\nfrom tune_advisor import render, results\n"
                f"render.write_reports(results.read({str(ROOT / 'reports' / name / 'results.json')!r}), "
                f"__import__('pathlib').Path({str(tmp_path / name)!r}))\n"
                "print('TORCH:', sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning', "
                "'transformers')))\n")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        # THEN neither torch nor the framework is imported, and the recommendation is in the framework's terms
        assert done.returncode == 0, done.stderr
        assert "TORCH: []" in done.stdout, done.stdout
        assert "change these" in (tmp_path / name / "report.md").read_text()
