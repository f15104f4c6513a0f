"""The Hugging Face Trainer adapter: the baseline read from TrainingArguments, the recommendation written back as
the fields to change, and every way a build_trainer() file can be wrong (exit 2, the file and the fix named)."""

import math
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch

from tune_advisor import frameworks, knobs, workload
from tune_advisor.errors import WorkloadError
from tune_advisor.frameworks import hf, hf_loop
from tune_advisor.render import markdown, view

from ..conftest import BAD, FIXTURES, WORKLOADS, golden
from ..fakes import StopAfter


def args(**changed):
    """TrainingArguments' fields as the adapter reads them (the defaults of transformers 5, then `changed`)."""
    fields = dict(per_device_train_batch_size=8, gradient_accumulation_steps=1, dataloader_num_workers=0,
                  dataloader_pin_memory=True, dataloader_prefetch_factor=None, dataloader_persistent_workers=False,
                  bf16=False, fp16=False, tf32=None, torch_compile=False, torch_compile_mode=None,
                  gradient_checkpointing=False, optim="adamw_torch", ddp_bucket_cap_mb=None, ddp_backend=None)
    return SimpleNamespace(**{**fields, **changed})


def config(**changed):
    return {"args": vars(args(**changed)), "optimizer_source": "args"}


def adamw(**flags):
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], **flags)


def test_the_fixture_loads_as_a_trainer_workload():
    # WHEN the shipped fixture, which defines only build_trainer(), is loaded
    wl = workload.load(FIXTURES / "hf_trainer.py")
    # THEN its parts come from the Trainer: the model, the dataset, the collator, the optimizer from args.optim
    assert wl.framework["name"] == "hf" and wl.framework["config"]["args"]["gradient_accumulation_steps"] == 4
    model, dataset = wl.call("build_model"), wl.call("build_dataset")
    assert type(model).__name__ == "GPT2LMHeadModel" and len(dataset) == 1024
    optimizer = wl.call("build_optimizer", model.parameters())
    assert isinstance(optimizer, torch.optim.AdamW) and optimizer.defaults["lr"] == 3e-4
    # AND the baseline is the user's TrainingArguments; throughput counts the attention mask's tokens
    assert wl.baseline == {"batch_size": 8, "num_workers": 0, "pin_memory": True, "amp": "off",
                           "matmul_precision": "highest", "compile": "off", "checkpointing": False,
                           "optimizer_impl": "default"}
    batch = wl.collate_fn([dataset[0], dataset[1]])
    assert wl.item_name == "tokens" and wl.count_items(batch) == int(batch["attention_mask"].sum())
    # AND the loss is the Trainer's: the model's own output loss, computed in train mode as trainer.train() does
    torch.manual_seed(0)
    model.eval()
    loss = wl.compute_loss(model, batch)
    assert model.training and torch.allclose(loss, model(**batch).loss)  # the fixture has no dropout


def test_a_probe_runs_trainer_train_with_the_settings_as_training_arguments(tmp_path):
    # GIVEN the tiny Trainer (batch 8, accumulation 4) and settings with a batch of 16 and two loader workers
    wl = workload.load(WORKLOADS / "tiny_trainer.py")
    settings = knobs.full_settings({**wl.baseline, "batch_size": 16, "num_workers": 2, "prefetch_factor": 2})
    probe = StopAfter(6)
    # WHEN a probe runs the framework's own loop
    applied = wl.loop.run(settings, "cpu", probe, tmp_path)
    # THEN trainer.train() ran until the probe stopped it: the fields set (the effective batch of 32 kept through
    # accumulation 2), each micro-batch a step of a cycle of 2, the Trainer's loss at each optimizer step
    fields = applied["training_arguments"]
    assert fields["per_device_train_batch_size"] == 16 and fields["gradient_accumulation_steps"] == 2
    assert fields["dataloader_num_workers"] == 2
    cycle, per_step, loader = probe.started_with
    assert (cycle, per_step) == (2, 1) and len(loader) == 256 // 16 and loader.num_workers == 2
    assert probe.losses[0::2] == [None] * 3 and all(3.0 < loss < 5.0 for loss in probe.losses[1::2])  # ln(64)
    # AND what the Trainer writes goes to the probe's scratch folder
    trainer = wl.loop.run.args[1]
    assert trainer.state.global_step == 3
    assert trainer.args.output_dir == str(tmp_path / "trainer") and trainer.args.save_strategy == "no"


def test_a_trainer_subclass_with_its_own_compute_loss_trains_through_it(tmp_path):
    wl = workload.load(WORKLOADS / "tiny_compute_loss.py")
    assert wl.framework["config"]["trainer_class"] == "SmoothedTrainer"
    probe = StopAfter(4)
    wl.loop.run(knobs.full_settings(wl.baseline), "cpu", probe, tmp_path)
    assert probe.started_with[:2] == (2, 1) and wl.loop.run.args[1].state.global_step == 2


@pytest.mark.parametrize("knob, value, field, expected", [
    ("amp", "bf16", "bf16", True),
    ("checkpointing", True, "activation_checkpointing", True),
    ("compile", "max-autotune", "torch_compile_mode", "max-autotune"),
    ("num_workers", 0, "dataloader_prefetch_factor", None),
])
def test_a_probes_settings_become_training_arguments_fields(knob, value, field, expected):
    settings = knobs.full_settings({"batch_size": 8, knob: value})
    found, rest = hf_loop.fields(hf.arguments, settings, config(), "cpu", hf.OptimizerStep(8, 4),
                                 {"activation_checkpointing"})
    assert found[field] == expected and found["gradient_accumulation_steps"] == 4 and found["use_cpu"]
    assert "tf32" not in found  # refused without a GPU that has it: the matmul knob is set globally instead


def test_the_trainers_optimizer_groups_follow_its_weight_decay():
    wl = workload.load(FIXTURES / "hf_trainer.py")
    model = wl.call("build_model")
    optimizer = wl.call("build_optimizer", model.parameters())
    # the Trainer splits decayed weights from biases and norms, as TrainingArguments(weight_decay=0.01) says
    assert sorted(g["weight_decay"] for g in optimizer.param_groups) == [0.0, 0.01]


@pytest.mark.parametrize("changed, expected", [
    ({}, {"batch_size": 8, "num_workers": 0, "amp": "off", "compile": "off", "optimizer_impl": "default"}),
    ({"dataloader_num_workers": 4, "dataloader_prefetch_factor": 3, "dataloader_persistent_workers": True},
     {"num_workers": 4, "prefetch_factor": 3, "persistent_workers": True}),
    ({"dataloader_num_workers": 2}, {"prefetch_factor": 2, "persistent_workers": False}),
    ({"bf16": True}, {"amp": "bf16"}), ({"fp16": True}, {"amp": "fp16"}), ({"tf32": True},
                                                                           {"matmul_precision": "high"}),
    ({"torch_compile": True}, {"compile": "default"}),
    ({"torch_compile": True, "torch_compile_mode": "max-autotune"}, {"compile": "max-autotune"}),
    ({"gradient_checkpointing": True, "dataloader_pin_memory": False}, {"checkpointing": True, "pin_memory": False}),
])
def test_training_arguments_become_the_baseline(changed, expected):
    baseline = hf.baseline(args(**changed), adamw())
    assert expected.items() <= baseline.items()
    if not changed.get("dataloader_num_workers"):  # worker-only loader arguments mean nothing without workers
        assert "prefetch_factor" not in baseline and "persistent_workers" not in baseline


def test_the_optimizers_implementation_is_read_from_the_optimizer_itself():
    assert hf.baseline(args(optim="adamw_torch_fused"), adamw(fused=True))["optimizer_impl"] == "fused"
    assert hf.baseline(args(), adamw(foreach=True))["optimizer_impl"] == "foreach"


def test_a_larger_batch_keeps_the_effective_batch_through_accumulation():
    # GIVEN batch 8 x accumulation 4 (effective 32)
    base = knobs.full_settings({"batch_size": 8})
    rec = {**base, "batch_size": 16, "num_workers": 2}
    text = hf.recommendation(base, rec, config(gradient_accumulation_steps=4))
    # THEN the diff halves the accumulation, next to the batch size, and says why
    lines = text.splitlines()
    assert lines[1:5] == ["- per_device_train_batch_size=8,", "+ per_device_train_batch_size=16,",
                          "- gradient_accumulation_steps=4,",
                          "+ gradient_accumulation_steps=2,  # keeps the effective batch of 32"]
    assert "+ dataloader_num_workers=2," in lines
    note = hf.batch_note(base, rec, config(gradient_accumulation_steps=4))
    assert "the effective batch stays 32 (16 x 2)" in note


def test_the_probe_steps_the_optimizer_as_the_trainer_does():
    # the fixture's Trainer accumulates 4 batches of 8 and clips at TrainingArguments' default max_grad_norm=1.0
    rule = workload.load(FIXTURES / "hf_trainer.py").optimizer_step
    assert rule == frameworks.OptimizerStep(batch_size=8, accumulate=4, clip_value=1.0, clip="norm")
    # a probe at another batch accumulates what keeps the effective batch of 32, as the recommendation writes it
    assert [rule.every(b) for b in (8, 16, 32, 64)] == [4, 2, 1, 1]
    # max_grad_norm 0 turns clipping off, but the Trainer still computes the norm for its log: an infinite bound
    assert hf.optimizer_step(args(max_grad_norm=0)).clip_value == math.inf
    grads = [torch.nn.Parameter(torch.ones(3))]
    grads[0].grad = torch.full((3,), 4.0)
    assert float(torch.nn.utils.clip_grad_norm_(grads, math.inf)) == pytest.approx(48 ** 0.5)
    assert grads[0].grad.tolist() == [4.0, 4.0, 4.0]  # computed, not clipped
    assert hf.optimizer_step(args(max_grad_norm=None, gradient_accumulation_steps=2)).accumulate == 2


def test_a_batch_past_the_effective_batch_says_the_optimisation_changes():
    base = knobs.full_settings({"batch_size": 8})
    rec = {**base, "batch_size": 16}
    text = hf.recommendation(base, rec, config())
    assert "gradient_accumulation_steps" not in text  # already 1: nothing to change there
    note = hf.batch_note(base, rec, config())
    assert "changes from 8 to 16" in note and "scale the learning rate about 2x" in note


@pytest.mark.parametrize("knob, value, fields, code", [
    ("amp", "bf16", {"bf16": True, "fp16": False}, None),
    ("matmul_precision", "high", {"tf32": True}, None),
    ("compile", "reduce-overhead", {"torch_compile": True, "torch_compile_mode": "reduce-overhead"}, None),
    ("checkpointing", True, {"gradient_checkpointing": True}, None),
    ("prefetch_factor", 4, {"dataloader_prefetch_factor": 4}, None),
    ("optimizer_impl", "fused", {"optim": "adamw_torch_fused"}, None),
    ("channels_last", True, {}, "memory_format=torch.channels_last"),
    ("cudnn_benchmark", True, {}, "torch.backends.cudnn.benchmark = True"),
    ("matmul_precision", "medium", {}, 'set_float32_matmul_precision("medium")'),
    ("optimizer_impl", "foreach", {}, "optimizers=(optimizer, None)"),
])
def test_each_knob_maps_to_a_field_or_to_code_to_add(knob, value, fields, code):
    found, add = hf.arguments(knob, value, config())
    assert found == fields
    assert (add is None) == (code is None) and (code is None or code in add)


def test_a_knob_without_a_field_is_written_as_code_after_the_diff():
    base = knobs.full_settings({"batch_size": 8})
    text = hf.recommendation(base, {**base, "channels_last": True, "amp": "bf16"}, config())
    assert "- bf16=False,\n+ bf16=True," in text
    head, code = text.split("# and before trainer.train():")
    assert "channels_last" not in head and "no TrainingArguments field" in code


def test_the_report_writes_the_recommendation_as_training_arguments():
    # GIVEN a run whose workload was a Trainer
    doc = golden("cnn")
    doc["workload"]["framework"] = {"name": "hf", "config": config()}
    report = view.build(doc)
    # THEN "Apply it" is the TrainingArguments diff, in every renderer that shows it
    assert report.snippet.startswith("# TrainingArguments(...)")
    assert ("framework", "Hugging Face Trainer (build_trainer)") in report.workload
    assert "# TrainingArguments(...)" in markdown.render(doc)


# --- errors: exit code 2, the file and the fix ---------------------------------------------------------------------

def write(tmp_path, text):
    path = tmp_path / "workload.py"
    path.write_text(textwrap.dedent(text))
    return path


@pytest.mark.parametrize("name, expected", [
    ("hf_no_train_dataset.py", ["has no train_dataset", "fix: pass train_dataset=... to Trainer(...)"]),
    ("hf_not_a_trainer.py", ["build_trainer() returned a BertForSequenceClassification, not a transformers.Trainer",
                             "fix: return the transformers.Trainer"]),
])
def test_an_unusable_trainer_exits_2_naming_the_file_and_the_fix(cli, name, expected):
    result = cli("probe", BAD / name, "--device", "cpu")
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert name in text and all(fragment in text for fragment in expected)
    assert "Traceback" not in result.output


def test_build_trainer_that_is_not_a_function(cli, tmp_path):
    path = write(tmp_path, "build_trainer = 'trainer'\n")
    with pytest.raises(WorkloadError, match="build_trainer is a str, not a function"):
        workload.load(path)
    assert cli("probe", path, "--device", "cpu").exit_code == 2


def test_build_trainer_raising_names_the_users_line(tmp_path):
    path = write(tmp_path, """\
        def build_trainer():
            raise RuntimeError("no GPU quota")
        """)
    with pytest.raises(WorkloadError, match="build_trainer\\(\\) raised RuntimeError: no GPU quota") as caught:
        workload.load(path)
    assert caught.value.line == 2


def test_transformers_not_installed_names_the_extra(monkeypatch, tmp_path):
    # GIVEN transformers cannot be imported (None in sys.modules makes `import transformers` fail)
    monkeypatch.setitem(sys.modules, "transformers", None)
    # WHEN the file imports it inside build_trainer(): the adapter's check names the extra
    path = write(tmp_path, "def build_trainer():\n    from transformers import Trainer\n")
    with pytest.raises(WorkloadError, match=r"needs the 'transformers' package") as caught:
        workload.load(path)
    assert "pip install 'tune-advisor[hf]'" in caught.value.fix
    # AND when it imports it at the top: the import error names the same extra
    path = write(tmp_path, "import transformers\n\ndef build_trainer():\n    pass\n")
    with pytest.raises(WorkloadError, match="cannot import") as caught:
        workload.load(path)
    assert "pip install 'tune-advisor[hf]'" in caught.value.fix


def test_transformers_not_installed_exits_2_through_the_cli(cli, tmp_path):
    # GIVEN a package beside the workload that shadows transformers and fails to import, as a missing one does
    (tmp_path / "transformers").mkdir()
    (tmp_path / "transformers" / "__init__.py").write_text("raise ImportError('transformers is not installed')\n")
    path = write(tmp_path, "def build_trainer():\n    pass\n")
    result = cli("probe", path, "--device", "cpu")
    assert result.exit_code == 2, result.output
    assert "pip install 'tune-advisor[hf]'" in result.output and "Traceback" not in result.output


def test_detection_follows_what_the_file_defines():
    def module(*names):
        return SimpleNamespace(**{n: (lambda: None) for n in names})

    assert frameworks.kind_of(module("build_trainer")) == "hf"
    assert frameworks.kind_of(module("build_module")) == "lightning"
    assert frameworks.kind_of(module("build_model", "build_dataset", "build_trainer")) is None  # plain wins
    assert frameworks.kind_of(module("train")) is None


@pytest.mark.parametrize("name", ["hf", "lightning"])
def test_a_hand_edited_framework_entry_renders_without_error(name):
    # GIVEN a results.json whose framework config and recommended settings hold nonsense
    doc = golden("cnn")
    doc["workload"]["framework"] = {"name": name, "config": {"args": 5, "trainer_args": {"accumulate_grad_batches":
                                                                                          "x"}}}
    doc["recommended"]["settings"].update(batch_size=0, amp="<b>")
    # THEN every renderer still writes its report
    for renderer in (markdown,):
        assert renderer.render(doc)
    view.build(doc)


def test_findings_fixes_are_written_in_the_frameworks_terms():
    doc = golden("cnn")
    doc["workload"]["framework"] = {"name": "hf", "config": config()}
    doc["findings"] = [{"code": "TA101", "name": "input-pipeline-bound", "severity": "warning", "message": "m",
                        "fix": {"settings": {"num_workers": 2}, "snippet": "loader = DataLoader(...)"}},
                       {"code": "TA801", "name": "threads", "severity": "warning", "message": "m",
                        "fix": {"settings": {}, "snippet": "torch.set_num_threads(1)"}}]
    loader, threads = view.build(doc).findings
    assert "+ dataloader_num_workers=2," in loader.snippet
    assert threads.snippet == "torch.set_num_threads(1)"  # code only: as the rule wrote it


@pytest.mark.parametrize("defined, meant", [("build_trainr", "build_trainer"), ("build_modul", "build_module")])
def test_a_misspelled_entry_is_named(tmp_path, defined, meant):
    path = write(tmp_path, f"def {defined}():\n    pass\n")
    with pytest.raises(WorkloadError, match=f"no {meant}\\(\\) defined \\(found '{defined}': a typo\\?\\)"):
        workload.load(path)


def test_a_trainer_over_an_iterable_dataset_loads(tmp_path):
    # GIVEN a Trainer whose train_dataset is a stream without length or indexing
    path = write(tmp_path, """\
        import torch
        from torch.utils.data import IterableDataset


        class Stream(IterableDataset):
            def __iter__(self):
                for i in range(64):
                    ids = torch.randint(0, 64, (8,))
                    yield {"input_ids": ids, "labels": ids.clone()}


        def build_trainer():
            from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

            config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=8)
            args = TrainingArguments(output_dir=str(__import__("tempfile").mkdtemp()), report_to="none",
                                     per_device_train_batch_size=4, max_steps=10)
            return Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=Stream())
        """)
    wl = workload.load(path)
    # THEN its first sample is read by iterating, and without attention_mask the unit is samples
    assert wl.item_name == "samples" and wl.count_items is None
    assert wl.baseline["batch_size"] == 4
