"""Loading and validating the user's workload file (SPEC §2).

`check_file` runs in the parent and executes nothing; `load` imports the file (only ever inside a child process)
and turns every way it can be wrong into a WorkloadError naming the file, the line and the fix.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import inspect
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from . import frameworks, knobs
from .errors import WorkloadError

REQUIRED = ("build_model", "build_dataset")
CONTRACT = "a workload file defines build_model() and build_dataset() (SPEC §2)"
# A file is a workload when it defines one of ENTRY_POINTS that the tool can call with no arguments and no
# `__main__` block of it drives training; otherwise it is a plain training script, analysed in script mode
# (tune_advisor/script/). CONTRACT_NAMES only keep a file of definitions (nothing would run as a script) a workload.
ENTRY_POINTS = ("build_model", "build_trainer", "build_module")
CONTRACT_NAMES = ("build_dataset", "compute_loss", "build_optimizer", "collate_fn", "count_items", "BASELINE",
                  "SEARCH")
# Calls that train: a main block reaching one of these (directly or through the file's own functions) drives training.
TRAINING_CALLS = ("backward", "step", "fit", "train")
FORCE_SCRIPT = "--script"  # the analyze option that runs a file as a plain script whatever it defines
MODULE_NAME = "tune_advisor_workload"  # registered in sys.modules so spawned loader workers can unpickle its classes


def check_file(path: str | Path) -> Path:
    """Static checks in the parent: the file exists, is Python text and parses. Returns the absolute path."""
    p = Path(path)
    shown = str(path)
    if not p.exists():
        raise WorkloadError(shown, "no such file", f"pass the path of a Python file; {CONTRACT}")
    if p.is_dir():
        raise WorkloadError(shown, "is a folder, not a file", f"pass the path of a Python file; {CONTRACT}")
    if p.suffix != ".py":
        raise WorkloadError(shown, f"not a Python file (its extension is '{p.suffix or 'none'}')",
                            f"pass a .py file; {CONTRACT}")
    try:
        source = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise WorkloadError(shown, "not a Python file (it is not UTF-8 text)", f"pass a .py file; {CONTRACT}") from None
    try:
        ast.parse(source, filename=shown)
    except SyntaxError as exc:
        raise WorkloadError(shown, f"syntax error: {exc.msg}", "fix the syntax error and run again",
                            line=exc.lineno) from None
    return p.resolve()


def is_script(path: str | Path) -> bool:
    """Whether the file is a plain training script rather than a workload. Parsed, never run: call after check_file.

    A workload defines an entry point (ENTRY_POINTS) the tool can call with no arguments (a `def` without required
    parameters, or a name it imports or assigns) and has no `if __name__ == "__main__":` block that drives training
    (main_drives_training). A file that runs code of its own (such a block, or statements at its top level) and
    fails that is a script, even with a `def build_model(args):` or a `collate_fn` of its own. A file of
    definitions alone would run nothing as a script: it stays a workload when it names the contract (or comes close
    to an entry point's name, a typo), so that loading it names what is missing."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    main = main_block(tree)
    if main is not None and main_drives_training(tree, main):
        return True
    if callable_entry_points(tree):
        return False
    if main is not None or _runs_code(tree):
        return True
    names = _top_level_names(tree)
    if names & {*ENTRY_POINTS, *CONTRACT_NAMES}:
        return False
    return not any(difflib.get_close_matches(entry, names, n=1, cutoff=0.85) for entry in ENTRY_POINTS)


def framework_of(path: str | Path) -> str | None:
    """The framework a workload file hands over, from the names it binds: parsed, never run (frameworks.kind_of
    says for sure once it is loaded)."""
    return frameworks.kind_named(_top_level_names(ast.parse(Path(path).read_text(encoding="utf-8"))))


def _top_level_names(tree: ast.Module) -> set[str]:
    """The names the module binds at its top level: by def, class, assignment or import."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def callable_entry_points(tree: ast.Module) -> list[str]:
    """The ENTRY_POINTS the tool can call with no arguments: defined without required parameters, or bound by
    import or assignment (their signature is not in the file: taken as the contract's)."""
    found = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if node.name in ENTRY_POINTS and not required_parameters(node.args):
                found.append(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom, ast.Assign, ast.AnnAssign)):
            found += sorted(_top_level_names(ast.Module([node], [])) & set(ENTRY_POINTS))
    return found


def required_parameters(args: ast.arguments) -> list[str]:
    """The parameters a call must pass: positional ones without a default, keyword-only ones without one."""
    positional = [*args.posonlyargs, *args.args]
    required = [a.arg for a in positional[:len(positional) - len(args.defaults)]]
    return required + [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is None]


def main_block(tree: ast.Module) -> ast.If | None:
    """The top-level `if __name__ == "__main__":` block, if any."""
    for node in tree.body:
        test = node.test if isinstance(node, ast.If) else None
        if (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
                and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)):
            return node
    return None


def main_drives_training(tree: ast.Module, main: ast.If) -> bool:
    """Whether the main block trains: it reaches a call of TRAINING_CALLS (`loss.backward()`,
    `optimizer.step()`, `trainer.fit(...)`, `trainer.train()`), itself or through the file's own functions, or it
    calls a function the file imports (whose code is not here: a `main()` from the user's package). A block that
    only prints or checks what build_model() returns does not."""
    functions = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    imported = {(a.asname or a.name) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    seen: set[str] = set()
    todo: list[ast.AST] = [main]
    while todo:
        for node in ast.walk(todo.pop()):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Attribute) and node.func.attr in TRAINING_CALLS:
                return True
            name = node.func.id if isinstance(node.func, ast.Name) else None
            if name in imported:
                return True
            if name in functions and name not in seen:
                seen.add(name)
                todo.append(functions[name])
    return False


def _runs_code(tree: ast.Module) -> bool:
    """Whether the module does work at its top level (loops, calls, `with`) beyond binding names (a guarded
    import in `try` or `if` binds names)."""
    for node in tree.body:
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith)):
            return True
        if isinstance(node, ast.Expr) and not isinstance(node.value, ast.Constant):  # a docstring is no work
            return True
    return False


def user_frame(exc: BaseException, path: str | Path) -> tuple[int | None, str | None]:
    """(line, function) of the innermost frame of `exc` inside the workload file, else (None, None).

    Exceptions from DataLoader workers arrive re-raised in the main process with the worker's traceback as text,
    so that text is searched too.
    """
    path = str(Path(path).resolve())
    found: tuple[int | None, str | None] = (None, None)
    for frame in traceback.extract_tb(exc.__traceback__):
        if str(Path(frame.filename).resolve()) == path:
            found = (frame.lineno, frame.name)
    for match in re.finditer(r'File "([^"]+)", line (\d+), in (\S+)', str(exc)):
        if str(Path(match.group(1)).resolve()) == path:
            found = (int(match.group(2)), match.group(3))
    return found


def exception_summary(exc: BaseException) -> str:
    """`Type: message` with a worker's embedded traceback reduced to its last line."""
    text = str(exc).strip()
    if "Original Traceback" in text:  # torch's ExceptionWrapper: keep the original exception's own line
        lines = [ln for ln in text.splitlines() if ln.strip()]
        text = lines[-1].strip() if lines else text
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass
class Workload:
    path: Path
    module: Any
    build_model: Callable
    build_dataset: Callable
    compute_loss: Callable | None
    build_optimizer: Callable | None
    collate_fn: Callable | None
    count_items: Callable | None
    item_name: str
    baseline: dict[str, Any]
    search: dict[str, list]
    framework: dict[str, Any] | None = None  # {"name": "hf" | "lightning", "config": ...} (frameworks/)
    optimizer_step: frameworks.OptimizerStep | None = None  # the framework loop's accumulation and clipping
    loop: frameworks.Loop | None = None  # the framework's own loop, which probes run (probe/loop.py)

    def call(self, name: str, *args):
        """Call a user function; a raise becomes a WorkloadError pointing at the user's line."""
        try:
            return getattr(self, name)(*args)
        except WorkloadError:  # an adapter's own check on what the user's object returned
            raise
        except Exception as exc:
            line, _ = user_frame(exc, self.path)
            raise WorkloadError(str(self.path), f"{name}() raised {exception_summary(exc)}",
                                f"make {name}() run on its own (try it in a Python shell)", line=line) from exc


def load(path: str | Path) -> Workload:
    """Import the workload file and validate it. Runs the user's module code: call only in a child process."""
    p = check_file(path)
    shown = str(path)
    sys.path.insert(0, str(p.parent))  # sibling imports of the user's file work as when they run it
    spec = importlib.util.spec_from_file_location(MODULE_NAME, p)
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE_NAME] = module
    try:
        spec.loader.exec_module(module)
    except ImportError as exc:
        line, _ = user_frame(exc, p)
        raise WorkloadError(shown, f"cannot import: {exc}", frameworks.install_hint(exc.name) or
                            "install the missing module or fix the import", line=line) from exc
    except SystemExit as exc:
        raise WorkloadError(shown, f"calls sys.exit({exc.code}) at import", "guard script code with "
                            "`if __name__ == '__main__':`") from exc
    except Exception as exc:
        line, _ = user_frame(exc, p)
        raise WorkloadError(shown, f"importing it raised {exception_summary(exc)}", "fix the module-level code",
                            line=line) from exc

    _check_entry_signatures(module, shown, p)
    kind = frameworks.kind_of(module)  # build_trainer() / build_module(): a framework object handed over
    if kind is not None:
        return _framework_workload(p, module, kind, shown)
    typo = frameworks.misspelled_entry(module)
    if typo:
        raise WorkloadError(shown, f"no {typo[0]}() defined (found '{typo[1]}': a typo?)", f"rename it {typo[0]}()")
    for name in REQUIRED:
        if not callable(getattr(module, name, None)):
            defined = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")]
            close = difflib.get_close_matches(name, defined, n=1)
            hint = f" (found '{close[0]}': a typo?)" if close else ""
            raise WorkloadError(shown, f"no {name}() defined{hint}", f"define {name}(); {CONTRACT}; "
                                f"{script_hint(shown)}")

    return Workload(
        path=p, module=module,
        build_model=module.build_model, build_dataset=module.build_dataset,
        compute_loss=_optional_callable(module, "compute_loss", shown),
        build_optimizer=_optional_callable(module, "build_optimizer", shown),
        collate_fn=_optional_callable(module, "collate_fn", shown),
        count_items=_optional_callable(module, "count_items", shown),
        item_name=str(getattr(module, "ITEM_NAME", "samples")),
        baseline=_validated(module, "BASELINE", knobs.validate_settings, p),
        search=_validated(module, "SEARCH", knobs.validate_search, p),
    )


def script_hint(shown: str) -> str:
    """How to run a file taken for a workload as the plain training script it may be."""
    return (f"or, if it is a training script, analyse it as one (script mode): tune-advisor analyze {shown} "
            f"{FORCE_SCRIPT} -- ARGS")


def _check_entry_signatures(module, shown: str, path: Path) -> None:
    """An entry point the tool would call with no arguments must take none (a training script's
    `build_model(args)` is no workload's); WorkloadError naming its parameters and script mode otherwise."""
    for name in ENTRY_POINTS:
        fn = getattr(module, name, None)
        if not callable(fn):
            continue
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):  # a builtin or C callable: nothing to read
            continue
        required = [p.name for p in signature.parameters.values() if p.default is p.empty
                    and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if required:
            code = getattr(fn, "__code__", None)
            here = code is not None and Path(code.co_filename).resolve() == path
            raise WorkloadError(shown, f"{name}({', '.join(required)}) takes arguments, and the tool calls "
                                       f"{name}() with none", f"give them defaults; {script_hint(shown)}",
                                line=code.co_firstlineno if here else None)


def _framework_workload(p: Path, module, kind: str, shown: str) -> Workload:
    """A Trainer or LightningModule as a Workload (frameworks/); the file's count_items, ITEM_NAME, BASELINE and
    SEARCH still apply, over what the framework's configuration says."""
    def call(label: str, fn: Callable, *args):
        try:
            return fn(*args)
        except WorkloadError:
            raise
        except Exception as exc:
            line, _ = user_frame(exc, p)
            raise WorkloadError(shown, f"{label} raised {exception_summary(exc)}",
                                f"make {label} run on its own (try it in a Python shell)", line=line) from exc

    adapted = frameworks.adapt(kind, module, shown, call)
    count_items = _optional_callable(module, "count_items", shown)
    return Workload(
        path=p, module=module, build_model=adapted.build_model, build_dataset=adapted.build_dataset,
        compute_loss=adapted.compute_loss, build_optimizer=adapted.build_optimizer, collate_fn=adapted.collate_fn,
        count_items=count_items or adapted.count_items,
        item_name=str(getattr(module, "ITEM_NAME", None) or (adapted.item_name if not count_items else "samples")),
        baseline={**adapted.baseline, **_validated(module, "BASELINE", knobs.validate_settings, p)},
        search=_validated(module, "SEARCH", knobs.validate_search, p),
        framework={"name": adapted.framework, "config": adapted.config}, optimizer_step=adapted.optimizer_step,
        loop=adapted.loop,
    )


def _optional_callable(module, name: str, shown: str) -> Callable | None:
    value = getattr(module, name, None)
    if value is not None and not callable(value):
        raise WorkloadError(shown, f"{name} is a {type(value).__name__}, not a function", f"define def {name}(...)")
    return value


def _validated(module, name: str, validate: Callable, path: Path) -> dict:
    raw = getattr(module, name, None)
    if raw is None:
        return {}
    try:
        return validate(raw)
    except ValueError as exc:
        raise WorkloadError(str(path), f"{name}: {exc}", f"fix {name} (see `tune-advisor probe --help` for knobs)",
                            line=assignment_line(path, name)) from None


def assignment_line(path: Path, name: str) -> int | None:
    """The line of the top-level `NAME = ...` in the file."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node.lineno
    return None


# --- batches and the default loss -----------------------------------------------------------------------------


class BatchError(ValueError):
    """The batch has a shape the default loss cannot handle."""


BATCH_FIX = ("return (inputs, targets) from the dataset, or a dict whose model output has .loss (Hugging Face style), "
             "or define compute_loss(model, batch)")


def batch_kind(batch: Any) -> str:
    if isinstance(batch, Mapping):
        return "dict"
    if isinstance(batch, (tuple, list)) and len(batch) == 2:
        return "pair"
    if isinstance(batch, (tuple, list)):
        return f"{type(batch).__name__} of {len(batch)}"
    return type(batch).__name__


def default_loss(model, batch):
    """SPEC §2: a dict batch -> model(**batch).loss; an (inputs, targets) batch -> cross_entropy."""
    import torch.nn.functional as F

    kind = batch_kind(batch)
    if kind == "dict":
        out = model(**batch)
        loss = out.get("loss") if isinstance(out, Mapping) else getattr(out, "loss", None)
        if loss is None:
            raise BatchError("the batch is a dict but the model's output has no .loss (are labels in the batch?)")
        return loss
    if kind == "pair":
        inputs, targets = batch
        return F.cross_entropy(model(inputs), targets)
    raise BatchError(f"the batch is a {kind}, which the default loss cannot handle")
