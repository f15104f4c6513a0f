"""The three renderers behind one protocol, and one "Apply it" snippet whichever of them shows it."""

from __future__ import annotations

import html as html_lib
import io
import re

import pytest

from tune_advisor import knobs, record, snippets
from tune_advisor.render import Renderer, html, markdown, terminal, view

from ..conftest import golden

RENDERERS = {"html": html, "markdown": markdown, "terminal": terminal}


@pytest.mark.parametrize("name", sorted(RENDERERS))
def test_each_renderer_module_is_a_renderer_and_renders_the_recommended_settings(name):
    module = RENDERERS[name]
    assert isinstance(module, Renderer)
    assert isinstance(module.output_file_extension, str) and module.output_file_extension
    doc = golden("cnn")
    text = module.render(doc)
    assert isinstance(text, str) and text.strip()
    changes = view.build(doc).changes
    assert changes and knobs.describe(changes) in text  # batch_size=64, amp=bf16, channels_last=true
    assert "loader = DataLoader(dataset, batch_size=64, shuffle=True, num_workers=0)" in text


def test_the_terminal_renders_what_it_prints_as_plain_text():
    text = terminal.render(golden("cnn"))
    assert "2.29x faster (95% CI 2.21–2.38)." in text and "Apply it" in text
    assert "Speedup      2.29x" in terminal.render(golden("cnn"), verbose=True)
    assert "\x1b[" not in text and "[bold]" not in text  # no colour codes, no rich markup


def loader_document() -> dict:
    """The cnn run with a recommendation that pins memory and changes every loader knob."""
    doc = golden("cnn")
    doc["recommended"]["settings"].update(num_workers=4, pin_memory=True, persistent_workers=True, prefetch_factor=4)
    return doc


def apply_it(name: str, doc: dict) -> str:
    """The "Apply it" snippet as the user reads it in each output."""
    text = RENDERERS[name].render(doc)
    if name == "terminal":
        block = text.split("\nApply it\n")[1].splitlines()
        return "\n".join(line[4:] for line in block[:next(i for i, line in enumerate(block)
                                                           if not line.startswith("    "))])
    if name == "markdown":
        return re.search(r"### Apply it\n\n(`{3,})python\n(.*?)\n\1\n", text, re.S).group(2)
    return html_lib.unescape(re.search(r'<pre id="apply-it"><code>(.*?)</code></pre>', text, re.S).group(1))


def test_terminal_html_and_markdown_show_the_same_apply_it_snippet():
    doc = loader_document()
    shown = {name: apply_it(name, doc) for name in RENDERERS}
    expected = snippets.recommended(knobs.full_settings(doc["recommended"]["settings"]))
    assert shown == {name: expected for name in RENDERERS}
    assert "pin_memory=True" in expected and "prefetch_factor=4" in expected and "persistent_workers=True" in expected


@pytest.mark.parametrize("prefetch", [2, 4])
@pytest.mark.parametrize("pin", [False, True])
def test_a_findings_loader_fix_and_the_apply_it_snippet_agree_on_pinning_and_prefetching(pin, prefetch):
    settings = knobs.full_settings(dict(num_workers=2, pin_memory=pin, prefetch_factor=prefetch))
    fix, whole = snippets.dataloader(settings, cuda=True), snippets.recommended(settings)
    for text in (fix, whole):
        assert ("pin_memory=True" in text) == pin
        assert ("prefetch_factor=4" in text) == (prefetch == 4) and "prefetch_factor=2" not in text
    # on CUDA the fix spells pinning out either way, with the asynchronous copy when pinned
    assert ("pin_memory=False" in fix) == (not pin) and ("non_blocking=True" in fix) == pin
    assert "pin_memory" not in snippets.dataloader(settings, cuda=False)  # no CUDA: pinning does nothing


def test_every_renderer_shows_where_a_later_measure_of_the_speedup_falls_and_a_hand_edited_range_is_dropped():
    from tune_advisor.planner import figures

    # GIVEN the cnn run's confirmed speedup with the range a later session's measure of it falls in
    doc = golden("cnn")
    s = doc["speedup"]
    doc["speedup"]["later"] = figures.later(s["median"], s["ci_low"], s["ci_high"])
    shown = f"{s['later']['ci_low']:.2f}–{s['later']['ci_high']:.2f}x"
    # THEN each renderer shows it beside the confirmed speedup, whose own CI stays as it was
    text = {name: module.render(doc) for name, module in RENDERERS.items()}
    text["terminal"] = terminal.render(doc, verbose=True)  # a derivation: --verbose prints it
    assert f"Speedup      2.29x (95% CI 2.21–2.38); {shown} in a later session" in text["terminal"]
    assert f"{shown} in a later session: 95%: where a later measure" in text["markdown"].split("[^how]: ")[1]
    card = re.search(r'confirmed speedup</div>.*?<div class="detail" id="speedup-ci">(.*?)</div>', text["html"],
                     re.S).group(1)
    assert card == "95% CI 2.21–2.38x"  # the CI beside the figure; where a later measure falls, one click away
    how = text["html"].split('id="how-measured"')[1].split("</details>")[0]
    assert f"{shown} in a later session</strong>" not in how and f"{shown} in a later session: 95%: where" in how
    # AND the side-by-side comparison of two runs too
    assert f"{shown} in a later session" in html.render_compare(doc, golden("cnn"), ("a", "b"))
    # AND a file without it (written before it existed), or without one of its bounds, renders without it
    for missing in (None, {"ci_low": None, "ci_high": 3}):
        doc["speedup"]["later"] = missing
        assert "in a later session" not in terminal.render(doc) + markdown.render(doc) + html.render(doc)
    # AND junk in it is refused by the typed record (results.read says where), never rendered
    for junk in ("wide", {"ci_low": "x", "ci_high": 3}):
        doc["speedup"]["later"] = junk
        with pytest.raises(record.ValidationError, match="speedup.later"):
            terminal.render(doc)


def test_analyzes_live_output_is_one_status_line_and_verbose_adds_a_line_per_probe(monkeypatch):
    from pathlib import Path
    from types import SimpleNamespace

    from rich.console import Console

    from tune_advisor.cli import analyze

    monkeypatch.setattr(analyze, "err", Console(file=io.StringIO(), width=200))
    info = SimpleNamespace(baseline={"batch_size": 32}, facts=SimpleNamespace(model_class="M", parameters=10))
    finished = SimpleNamespace(settings={"batch_size": 32}, status=SimpleNamespace(value="ok"), ok=False, error="",
                               id="p001", role="baseline", wall_s=1.0)
    # GIVEN the default output: a probe starts and finishes
    live = analyze.LiveOutput(Path("x.py"), 60.0, show=True, quiet=False)
    live.on_start(info, None)
    live.on_probe_start("p001", {"batch_size": 32}, "baseline")
    live.on_probe(finished, None)
    # THEN nothing scrolls by: the one status line says the time of the budget and the probes done
    assert analyze.err.file.getvalue() == "" and live.status.status == "0 s / 60 s · 1 probe done"
    # AND --verbose prints the workload and the finished probe, as before
    verbose = analyze.LiveOutput(Path("x.py"), 60.0, show=True, quiet=False, verbose=True)
    verbose.on_start(info, None)
    verbose.on_probe(finished, None)
    assert "x.py: M, 10 parameters" in analyze.err.file.getvalue() and "p001  baseline" in analyze.err.file.getvalue()
