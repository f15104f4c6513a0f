"""Copy-paste code: the few lines a user adds to their own training script.

One module for both kinds: each finding's fix (the rules) and the whole recommendation, the reports' "Apply it"
(render.view, shown alike by the terminal, HTML and Markdown).
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

from . import knobs

AMP_DTYPES = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}


def loader_call(settings: Mapping[str, Any], pin_memory: Literal["when on", "always", "never"] = "when on",
                shuffle_first: bool = False) -> str:
    """`loader = DataLoader(dataset, ...)` with the loader knobs of `settings`: the one place that decides which of
    them a snippet spells out. Knobs at DataLoader's defaults are left out, except pin_memory with "always".

    pin_memory: "when on" (only pin_memory=True), "always" (True or False: on CUDA a finding about the loader shows
    it either way) or "never" (no CUDA: pinning does nothing). shuffle_first: shuffle=True before batch_size.
    """
    args = [f"batch_size={settings['batch_size']}", f"num_workers={settings['num_workers']}"]
    args.insert(0 if shuffle_first else 1, "shuffle=True")
    pinned = bool(settings.get("pin_memory"))
    if pin_memory == "always" or (pin_memory == "when on" and pinned):
        args.append(f"pin_memory={pinned}")
    if settings["num_workers"] > 0:  # the worker knobs exist only with workers (knobs.LOADER_KNOBS)
        if settings.get("persistent_workers"):
            args.append("persistent_workers=True")
        prefetch = settings.get("prefetch_factor", knobs.KNOBS["prefetch_factor"].default)
        if prefetch != knobs.KNOBS["prefetch_factor"].default:
            args.append(f"prefetch_factor={prefetch}")
    return f"loader = DataLoader(dataset, {', '.join(args)})"


NON_BLOCKING_COPY = "batch = [t.to(device, non_blocking=True) for t in batch]  # pinned + non_blocking: async copies"


def dataloader(settings: dict[str, Any], cuda: bool) -> str:
    """A finding's loader fix: the loader line (pin_memory spelled out on CUDA), and the non_blocking copy when
    pinned."""
    text = loader_call(settings, pin_memory="always" if cuda else "never", shuffle_first=True)
    if cuda and settings["pin_memory"]:
        text += "\n" + NON_BLOCKING_COPY
    return text


def autocast(amp: str, device_type: str) -> str:
    lines = [f'with torch.autocast(device_type="{device_type}", dtype={AMP_DTYPES[amp]}):',
             "    loss = compute_loss(model, batch)"]
    if amp == "fp16" and device_type == "cuda":
        lines = ['scaler = torch.amp.GradScaler("cuda")  # once, before the loop: fp16 gradients underflow without it',
                 *lines, "scaler.scale(loss).backward()", "scaler.step(optimizer)", "scaler.update()"]
    else:
        lines += ["loss.backward()  # outside autocast", "optimizer.step()"]
    return "\n".join(lines)


def channels_last() -> str:
    return ("model = model.to(memory_format=torch.channels_last)\n"
            "images = images.to(device).contiguous(memory_format=torch.channels_last)  # every 4-D input batch")


def cudnn_benchmark(on: bool) -> str:
    why = "input shapes are fixed: autotune once, reuse" if on else "input shapes vary: every new shape re-tunes"
    return f"torch.backends.cudnn.benchmark = {on}  # {why}"


def matmul_precision(value: str) -> str:
    return f'torch.set_float32_matmul_precision("{value}")  # TF32 tensor cores for float32 matmuls'


def checkpointing() -> str:
    return ("from torch.utils.checkpoint import checkpoint\n"
            "# in the model's forward, for each repeated block:\n"
            "x = checkpoint(block, x, use_reentrant=False)  # Hugging Face: model.gradient_checkpointing_enable()")


def lr_scaling(old_batch: int, new_batch: int) -> str:
    ratio = new_batch / old_batch
    return (f"# batch_size {old_batch} -> {new_batch}: scale the learning rate with the batch\n"
            f"lr = base_lr * {ratio:g}  # linear rule (SGD); Adam-style optimisers: base_lr * {ratio ** 0.5:.3g}")


def gradient_accumulation(steps: int) -> str:
    return "\n".join([
        f"accumulate = {steps}  # micro-batches per optimiser step",
        "for i, batch in enumerate(loader):",
        "    loss = compute_loss(model, batch) / accumulate",
        "    loss.backward()",
        "    if (i + 1) % accumulate == 0:",
        "        optimizer.step()",
        "        optimizer.zero_grad(set_to_none=True)",
    ])


def set_num_threads(threads: int) -> str:
    return (f"torch.set_num_threads({threads})  # intra-op threads: cores left after the loader workers\n"
            "# or, before Python starts: OMP_NUM_THREADS=" + str(threads))


def compile_model(mode: str) -> str:
    args = "" if mode == "default" else f', mode="{mode}"'
    return f"model = torch.compile(model{args})  # once, after moving the model to the device"


def recommended(settings: dict[str, Any]) -> str:
    """All the recommended settings as code a user pastes into their training script (the reports' "Apply it");
    its loader line is `loader_call`'s, as the findings' loader fixes are. pin_memory comes with non_blocking
    copies: pinned pages alone still leave the host waiting for each copy, and the gain measured was both."""
    lines = [loader_call(settings)]
    if settings.get("pin_memory"):
        lines.append(NON_BLOCKING_COPY)
    if settings["cudnn_benchmark"]:
        lines.insert(0, "torch.backends.cudnn.benchmark = True")
    if settings["matmul_precision"] != "highest":
        inside = "TF32" if settings["matmul_precision"] == "high" else "bf16"
        lines.insert(0, f'torch.set_float32_matmul_precision("{settings["matmul_precision"]}")  # {inside} inside '
                        'float32 matmuls')
    if settings["optimizer_impl"] != "default":
        lines.append(f"optimizer = torch.optim.AdamW(model.parameters(), lr=lr, {settings['optimizer_impl']}=True)"
                     "  # your optimizer class, same arguments")
    if settings["compile"] != "off":
        mode = "" if settings["compile"] == "default" else f', mode="{settings["compile"]}"'
        lines.append(f"model = torch.compile(model{mode})  # compiles at the first steps")
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
    return "\n".join(lines)
