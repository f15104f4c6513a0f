"""Terminal output with rich: one probe's numbers, a line per finished probe, and the analysis summary."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from .. import knobs
from ..probe.result import ProbeResult


def fmt_rate(value: float | None, unit: str = "") -> str:
    if value is None or value != value:
        return "-"
    text = f"{value:,.0f}" if value >= 100 else f"{value:.3g}" if value < 10 else f"{value:.1f}"
    return f"{text} {unit}".strip()


def fmt_bytes(value: int | None) -> str:
    if not value:
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value} B"


def fmt_throughput(result: ProbeResult) -> str:
    if not result.ok or not result.step_s:
        return "-"
    median, low, high = result.throughput()
    return f"{fmt_rate(median)} [{fmt_rate(low)}, {fmt_rate(high)}] {result.unit}"


def probe_line(result: ProbeResult, baseline: dict[str, Any] | None) -> str:
    """One line per finished probe while an analysis runs."""
    changed = knobs.describe(result.settings, baseline) if baseline else knobs.describe(result.settings)
    status = result.status.value
    detail = fmt_throughput(result) if result.ok else (result.error or "")
    return f"{result.id}  {result.role:<22} {changed:<40} {status:<8} {detail}  ({result.wall_s:.1f} s)"


def probe_table(result: ProbeResult, console: Console) -> None:
    """The full numbers of one probe (`tune-advisor probe`)."""
    d = result.to_dict()
    table = Table(title=f"probe: {knobs.describe(result.settings)}", show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("status", d["status"] + (f" — {d['error']}" if d["error"] else ""))
    if result.step_s:
        st = d["step_time_s"]
        table.add_row("throughput", fmt_throughput(result))
        table.add_row("step time", f"median {st['median'] * 1e3:.2f} ms, IQR {st['iqr'] * 1e3:.2f} ms "
                                   f"over {len(result.step_s)} measured steps")
        table.add_row("data wait", f"{d['data_wait_frac'] * 100:.1f}% of step time")
        h2d = result.raw.get("h2d_s") or []
        if h2d:
            table.add_row("host→device", f"{sum(h2d) / sum(result.step_s) * 100:.1f}% of step time")
        table.add_row("loss", f"first {d['loss']['first']}, last {d['loss']['last']}, "
                              f"finite {d['loss']['finite']}")
    table.add_row("peak memory", fmt_bytes(d["peak_memory_bytes"]))
    extra = result.extra
    if "warmup_s" in extra:
        table.add_row("warm-up", f"{extra['warmup_s']:.2f} s (excluded)")
    if extra.get("cpu_util") is not None:
        table.add_row("CPU utilisation", f"{extra['cpu_util'] * 100:.0f}% of all cores")
    table.add_row("wall", f"{result.wall_s:.1f} s")
    console.print(table)


def analysis_summary(result, console: Console) -> None:
    """Verdict, settings, failures and what was left unexplored (`tune-advisor analyze`)."""
    base, rec = result.baseline, result.recommended
    console.print()
    if not base.ok:
        console.print(f"[bold red]The baseline probe failed ({base.status.value}):[/] {base.error}")
    else:
        console.print(f"[bold]Baseline[/]     {knobs.describe(base.settings)}")
        console.print(f"               {fmt_throughput(base)}, peak memory {fmt_bytes(base.peak_memory_bytes)}")
        changes = result.changes
        if changes:
            console.print(f"[bold green]Recommended[/]  {knobs.describe(changes)}")
            console.print(f"               {fmt_throughput(rec)}, peak memory {fmt_bytes(rec.peak_memory_bytes)}")
        else:
            console.print("[bold]Recommended[/]  keep the baseline: no change beat it by more than the noise")
        sp = result.speedup
        if sp:
            console.print(f"[bold]Speedup[/]      {sp['median']:.2f}x  (95% CI {sp['ci_low']:.2f}–{sp['ci_high']:.2f}; "
                          f"{sp['method']})")
        if "batch_size" in changes:
            k = changes["batch_size"] / base.settings["batch_size"]
            console.print(f"               note: batch_size {base.settings['batch_size']} → {changes['batch_size']} "
                          f"changes optimisation: scale the learning rate (about {k:g}x linear, or √{k:g} for "
                          "Adam-style) or keep the old batch with gradient accumulation")
        if changes:
            console.print("\n[bold]Apply it[/]")
            console.print(settings_snippet(rec.settings), markup=False, highlight=False)
    failed = [p for p in result.probes if p.status.value not in ("ok", "skipped")]
    if failed:
        console.print("\n[bold]Failed probes[/]")
        for p in failed:
            console.print(f"  {p.id} {knobs.describe(p.settings, base.settings)}: [red]{p.status.value}[/] — {p.error}",
                          highlight=False)
    skipped = [p for p in result.probes if p.status.value == "skipped"]
    if skipped:
        console.print("\n[bold]Not applicable[/]")
        for p in skipped:
            reason = (p.error or "").removeprefix("not applicable: ")
            console.print(f"  {knobs.describe(p.settings, base.settings)}: {reason}", highlight=False)
    for note in result.notes:
        console.print(f"note: {note}", highlight=False)
    if result.unexplored:
        console.print(f"\nUnexplored ({len(result.unexplored)}): " + "; ".join(result.unexplored), highlight=False)
    console.print(f"\nresults: {result.results_path}")


def settings_snippet(settings: dict[str, Any]) -> str:
    """The recommended settings as code a user pastes into their training script."""
    lines = [f"loader = DataLoader(dataset, batch_size={settings['batch_size']}, shuffle=True, "
             f"num_workers={settings['num_workers']}" + (", pin_memory=True" if settings["pin_memory"] else "") + ")"]
    if settings["cudnn_benchmark"]:
        lines.insert(0, "torch.backends.cudnn.benchmark = True")
    if settings["channels_last"]:
        lines.append("model = model.to(memory_format=torch.channels_last)  # and inputs: "
                     "x = x.contiguous(memory_format=torch.channels_last)")
    if settings["checkpointing"]:
        lines.append("model.gradient_checkpointing_enable()  # Hugging Face; else torch.utils.checkpoint per block")
    if settings["amp"] != "off":
        dtype = "torch.bfloat16" if settings["amp"] == "bf16" else "torch.float16"
        lines.append(f"with torch.autocast(device_type=device.type, dtype={dtype}):")
        lines.append("    loss = compute_loss(model, batch)")
        if settings["amp"] == "fp16":
            lines.append("scaler = torch.amp.GradScaler('cuda')  # scaler.scale(loss).backward(); "
                         "scaler.step(opt); scaler.update()")
    return "\n".join("    " + line for line in lines)
