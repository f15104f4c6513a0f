"""Script mode's flag mapping: --map specs parsed (or refused with a clear message), the script's argv for a
configuration, and the recommendation as the command line to run."""

from __future__ import annotations

import os

import pytest

from tune_advisor import knobs
from tune_advisor.api import AnalyzeOptions
from tune_advisor.errors import UsageError
from tune_advisor.script import flags

BASE = knobs.full_settings({"batch_size": 32})


def test_a_value_flag_passes_the_knob_value_and_a_bool_flag_is_bare():
    maps = flags.parse_maps(["batch_size=--batch-size", "channels_last=--channels-last"])
    assert maps["batch_size"].argv(128) == ["--batch-size", "128"]
    assert maps["channels_last"].argv(True) == ["--channels-last"] and maps["channels_last"].argv(False) == []


def test_a_flag_with_values_passes_only_those_in_the_scripts_spelling():
    m = flags.parse_map("amp=--precision:bf16=bf16-mixed,fp16")
    assert m.values == {"bf16": "bf16-mixed", "fp16": "fp16"}
    assert m.argv("bf16") == ["--precision", "bf16-mixed"] and m.argv("off") == []
    assert flags.search_values({"amp": m}) == {"amp": ["off", "bf16", "fp16"]}


@pytest.mark.parametrize("spec, message", [
    ("batch_size", "expected KNOB=FLAG"),
    ("batchsize=--bs", "unknown knob 'batchsize' (did you mean 'batch_size'?)"),
    ("batch_size=bs", "'bs' is not a flag"),
    ("amp=--precision:fp8", "'fp8' is not a valid value for amp"),
    ("amp=--precision:", "nothing after ':'"),
])
def test_a_bad_map_is_a_usage_error_naming_the_problem(spec, message):
    with pytest.raises(UsageError) as raised:
        flags.parse_map(spec)
    assert message in str(raised.value)


def test_a_knob_mapped_twice_is_refused():
    with pytest.raises(UsageError, match="mapped twice"):
        flags.parse_maps(["amp=--precision:bf16", "amp=--amp"])


def test_argv_appends_only_the_mapped_knobs_that_differ_from_the_scripts_own():
    maps = flags.parse_maps(["batch_size=--batch-size", "amp=--precision:bf16"])
    settings = {**BASE, "batch_size": 128, "amp": "bf16", "num_workers": 4}
    argv = flags.script_argv(["--epochs", "1"], maps, settings, BASE)
    assert argv == ["--epochs", "1", "--batch-size", "128", "--precision", "bf16"]
    assert flags.script_argv(["--epochs", "1"], maps, BASE, BASE) == ["--epochs", "1"]
    assert flags.unmapped_changes(maps, settings, BASE) == {"num_workers": 4}


def test_the_command_line_is_shown_only_when_a_mapped_knob_changed():
    maps = flags.parse_maps(["batch_size=--batch-size"])
    assert flags.command_line("train.py", ["--lr", "3e-4"], maps, {**BASE, "batch_size": 64}, BASE) == \
        "python train.py --lr 3e-4 --batch-size 64"
    assert flags.command_line("train.py", [], maps, {**BASE, "num_workers": 2}, BASE) is None


def test_maps_survive_results_json():
    maps = flags.parse_maps(["amp=--precision:bf16", "channels_last=--cl", "batch_size=--batch-size"])
    assert flags.maps_from_json(flags.maps_to_json(maps)) == maps


def test_analyze_options_parse_maps_and_refuse_bad_ones():
    options = AnalyzeOptions(maps=["batch_size=--batch-size"], script_args=["--epochs", "1"])
    assert options.maps["batch_size"].flag == "--batch-size" and options.script_args == ("--epochs", "1")
    assert AnalyzeOptions(maps={"amp": "--precision:bf16"}).maps["amp"].values == {"bf16": "bf16"}
    with pytest.raises(UsageError, match="not a flag"):
        AnalyzeOptions(maps=["batch_size=size"])


def test_pyproject_map_table_becomes_the_map_option(tmp_path):
    from tune_advisor.cli.config import default_map

    (tmp_path / "pyproject.toml").write_text('[tool.tune-advisor.map]\nbatch_size = "--batch-size"\n'
                                             'amp = "--precision:bf16"\n')
    assert default_map(tmp_path)["analyze"] == {"flag_map": ["batch_size=--batch-size", "amp=--precision:bf16"]}
    (tmp_path / "pyproject.toml").write_text('[tool.tune-advisor]\nmap = "--batch-size"\n')
    with pytest.raises(UsageError, match="map must be a table"):
        default_map(tmp_path)


def test_a_bad_map_on_the_command_line_exits_2(cli, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    result = cli("analyze", script, "-o", tmp_path / "out", "--map", "batch_size")
    assert result.exit_code == 2 and "expected KNOB=FLAG" in result.output


def test_the_reports_print_the_command_line_beside_the_snippet():
    from tune_advisor.render import html, markdown, view

    from ..conftest import golden

    # GIVEN a script-mode run whose recommendation changes a mapped knob
    doc = golden("cnn")
    base = doc["baseline"]["settings"]["batch_size"]
    doc["recommended"]["settings"]["batch_size"] = base * 4
    doc["recommended"]["settings"]["num_workers"] = 3
    doc["workload"].update(path="train.py", kind="script",
                           script={"args": ["--epochs", "1"], "map": {"batch_size": {"flag": "--batch-size"}}})
    # THEN the report holds the command line to run, and the Markdown shows it under the snippet
    report = view.build(doc)
    assert report.run_command == f"python train.py --epochs 1 --batch-size {base * 4}"
    text = markdown.render(doc)
    assert text.index("Apply it") < text.index(report.run_command)
    assert report.run_command in html.render(doc)
    # AND the change no flag sets is named, to apply in code
    assert report.run_command_rest.startswith("num_workers=3") and "no flag of the script sets these" in text
    # AND a workload file's report has none
    assert view.build(golden("cnn")).run_command is None


def test_script_arguments_given_to_a_workload_file_are_usage_errors_and_a_ddp_script_gets_its_world_size():
    from tune_advisor.api.facade import script_mode
    from tune_advisor.distributed.launch import layout

    from ..conftest import WORKLOADS

    with pytest.raises(UsageError, match="takes no arguments after --"):
        script_mode(WORKLOADS / "tiny_mlp.py", AnalyzeOptions(script_args=["--epochs", "1"]), None)
    assert script_mode(WORKLOADS / "tiny_mlp.py", AnalyzeOptions(), None) is None
    script = WORKLOADS / "scripts" / "tiny_script.py"
    assert script_mode(script, AnalyzeOptions(), layout(2))["world_size"] == 2  # a script written for torchrun
    found = script_mode(script, AnalyzeOptions(script_args=["--epochs", "1"], maps=["batch_size=--batch-size"]), None)
    assert found == {"args": ["--epochs", "1"], "map": {"batch_size": {"flag": "--batch-size", "values": {}}},
                     "cwd": None, "home": os.getcwd(), "world_size": 1}


def test_a_flag_ending_in_equals_takes_its_value_joined_configurator_and_hydra_style():
    # nanoGPT's configurator takes --batch_size=64: two arguments (--batch_size= then 64) failed every probe
    maps = flags.parse_maps(["batch_size=--batch_size=", "amp=trainer.precision=:bf16=bf16-mixed",
                             "compile=--compile=:default=True,off=False"])
    assert maps["batch_size"].argv(64) == ["--batch_size=64"]
    assert maps["amp"].argv("bf16") == ["trainer.precision=bf16-mixed"]
    assert maps["compile"].argv("off") == ["--compile=False"]
    hydra = flags.parse_map("batch_size=training.batch_size=")
    assert hydra.argv(128) == ["training.batch_size=128"]


def test_a_mapped_flag_the_user_gave_is_replaced_where_it_stands():
    base = {**BASE, "batch_size": 12}
    args = ["config/train.py", "--device=cpu", "--batch_size=12", "--compile=False"]
    joined = flags.parse_maps(["batch_size=--batch_size="])
    assert flags.script_argv(args, joined, {**base, "batch_size": 64}, base) == \
        ["config/train.py", "--device=cpu", "--batch_size=64", "--compile=False"]
    hydra = flags.parse_maps(["batch_size=training.batch_size="])  # Hydra refuses a key given twice
    assert flags.script_argv(["training.batch_size=12", "lr=3"], hydra, {**base, "batch_size": 64}, base) == \
        ["training.batch_size=64", "lr=3"]
    spaced = flags.parse_maps(["batch_size=--batch-size"])
    assert flags.script_argv(["--batch-size", "12", "--lr", "1"], spaced, {**base, "batch_size": 64}, base) == \
        ["--batch-size", "64", "--lr", "1"]
    assert flags.script_argv(["--batch-size=12"], spaced, {**base, "batch_size": 64}, base) == ["--batch-size", "64"]
    assert flags.command_line("train.py", args, joined, {**base, "batch_size": 64}, base) == \
        "python train.py config/train.py --device=cpu --batch_size=64 --compile=False"


@pytest.mark.parametrize("spec, args, value", [
    ("batch_size=--batch_size=", ["--device=cpu", "--batch_size=12"], 12),
    ("batch_size=training.batch_size=", ["training.batch_size=24"], 24),
    ("batch_size=--batch-size", ["--batch-size", "16"], 16),
    ("batch_size=--batch-size", ["--batch-size=16"], 16),
    ("batch_size=--batch-size", ["--lr", "1"], None),
    ("amp=--precision:bf16=bf16-mixed", ["--precision", "bf16-mixed"], "bf16"),
])
def test_the_value_a_users_arguments_give_a_mapped_flag_is_read_back(spec, args, value):
    assert flags.parse_map(spec).value_in(args) == value


def test_a_flag_without_a_dash_must_end_in_equals():
    with pytest.raises(UsageError, match="ends with '=' to take its value joined"):
        flags.parse_map("batch_size=training.batch_size")


def test_probe_gate_and_baseline_refuse_a_script_before_it_runs_unless_told_it_is_a_workload(tmp_path):
    from tune_advisor.api.facade import script_mode
    from tune_advisor.api.inspection import inspect_workload
    from tune_advisor.errors import WorkloadError

    from ..conftest import WORKLOADS

    script = WORKLOADS / "scripts" / "helper_names.py"  # its build_model(args) and collate_fn are its own helpers
    with pytest.raises(WorkloadError) as raised:
        inspect_workload(script, "cpu", tmp_path)  # what probe, gate and baseline call, with no script
    assert "is a plain training script" in str(raised.value) and "--workload" in str(raised.value)
    # analyze decides: a script, or with --workload a workload (whose arguments after -- are refused)
    assert script_mode(script, AnalyzeOptions(), None)["args"] == []
    assert script_mode(script, AnalyzeOptions(as_script=False), None) is None
    with pytest.raises(UsageError, match="add --script to run it as one"):
        script_mode(WORKLOADS / "tiny_mlp.py", AnalyzeOptions(script_args=["--epochs", "1"]), None)
    assert script_mode(WORKLOADS / "tiny_mlp.py", AnalyzeOptions(as_script=True), None)["args"] == []


def test_the_reports_notes_say_where_the_batch_size_came_from_and_what_the_script_wrote():
    facts = {"batch_size_from": {"flag": "--batch_size=", "value": 12}, "wrote": ["out", "train_log.txt"]}
    probes = [{"extra": {"script": {"wrote": ["out", "out/ckpt.pt"]}}}, {"extra": {}}]
    batch, wrote = flags.script_notes(facts, probes)
    assert "builds no DataLoader, so batch_size is its --batch_size= flag: 12 on its command line" in batch
    assert wrote == "the script wrote out, train_log.txt, out/ckpt.pt: in each probe's scratch folder, not in yours"
    assert flags.script_notes({}, []) == []
