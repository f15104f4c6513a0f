"""`analyze` end to end on a Hugging Face Trainer and on a LightningModule handed over as they are: real child
probes, the baseline from the framework's own settings, and the recommendation in the framework's terms."""

import pytest

from tune_advisor import api, results

from ..conftest import FAST, WORKLOADS

pytestmark = pytest.mark.usefixtures("short_confirmation")


def analyze(name, tmp_path):
    # Only the loader ladder: the workloads' planted bottleneck (reads 8 ms a record), and enough to see the whole
    # path. The budget is generous, not tight: the plan ends on its own when the ladder is done (its time is
    # benchmarks' business), so a slow or busy machine takes longer but decides the same.
    options = api.AnalyzeOptions(out=tmp_path / "out", device="cpu", protocol=FAST, budget="5m",
                                 only_knobs=["num_workers"])
    return api.analyze(WORKLOADS / name, options)


def test_a_trainer_is_analysed_and_advised_as_training_arguments(tmp_path):
    # WHEN analyze runs on a file that defines only build_trainer()
    result = analyze("tiny_trainer.py", tmp_path)
    saved = results.read(result.results_path)
    # THEN the workload is recorded as a Trainer, its baseline is its TrainingArguments, throughput is in tokens
    assert saved["workload"]["framework"]["name"] == "hf"
    assert saved["workload"]["framework"]["config"]["args"]["gradient_accumulation_steps"] == 4
    assert result.baseline.ok and result.baseline.settings["batch_size"] == 8
    assert result.baseline.settings["num_workers"] == 0
    assert saved["baseline"]["throughput"]["unit"] == "tokens/s"
    # AND the records' read latency makes loader workers the advice, written as the TrainingArguments field
    workers = result.recommended.settings["num_workers"]
    assert workers > 0
    report = (result.out_dir / "report.md").read_text()
    assert "# TrainingArguments(...)" in report and f"+ dataloader_num_workers={workers}," in report


def test_a_lightning_module_is_analysed_and_advised_as_dataloader_arguments(tmp_path):
    result = analyze("tiny_lightning.py", tmp_path)
    saved = results.read(result.results_path)
    assert saved["workload"]["framework"]["name"] == "lightning"
    assert saved["workload"]["model_class"] == "TinyClassifier"
    assert result.baseline.ok and result.baseline.settings["batch_size"] == 16
    workers = result.recommended.settings["num_workers"]
    assert workers > 0
    report = (result.out_dir / "report.md").read_text()
    assert "# DataLoader(...) in train_dataloader()" in report and f"+ num_workers={workers}," in report


def analyze_batch(name, tmp_path):
    # Only the batch-size ladder of one rung (the fixtures' SEARCH): the test checks that the framework's own loop
    # runs and is measured, whatever it decides.
    options = api.AnalyzeOptions(out=tmp_path / "out", device="cpu", protocol=FAST, budget="3m",
                                 only_knobs=["batch_size"])
    result = api.analyze(WORKLOADS / name, options)
    saved = results.read(result.results_path)
    assert result.baseline.ok and all(p["status"] == "ok" for p in saved["probes"])
    return result, saved


@pytest.mark.parametrize("name, framework, config, key, value", [
    # manual optimization, two optimizers: it trains only under a real lightning.Trainer
    ("tiny_gan.py", "lightning", "config", "automatic_optimization", False),
    # self.trainer, self.current_epoch and a per-step schedule
    ("tiny_scheduled.py", "lightning", "config", "module_class", "Scheduled"),
    # a Trainer subclass with its own compute_loss, a dynamic-padding collator, a cosine schedule
    ("tiny_compute_loss.py", "hf", "config", "trainer_class", "SmoothedTrainer"),
])
def test_code_as_written_is_measured_through_its_frameworks_own_loop(tmp_path, name, framework, config, key, value):
    result, saved = analyze_batch(name, tmp_path)
    assert saved["workload"]["framework"]["name"] == framework
    assert saved["workload"]["framework"][config][key] == value
    # every probe ran the framework's loop: its arguments recorded, FLOPs and profiler left to it
    for probe in saved["probes"]:
        arguments = "training_arguments" if framework == "hf" else "trainer_arguments"
        assert arguments in probe["applied"]
        assert probe["extra"]["collectors"]["flops"].startswith("skipped: the framework's own loop")
    assert (result.out_dir / "report.md").is_file()
