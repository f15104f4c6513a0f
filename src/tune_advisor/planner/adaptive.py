"""The default planner: coordinate ascent over the knobs, most promising first, re-opening what interacts (SPEC §5).

Each round it asks, of the current best probe, how much each knob could still gain — a bound computed from what that
probe measured (the share of the step spent waiting for data or copying to the device, whether the batch ladder hit a
memory limit) — and explores the most promising knob on top of the current best. Knobs that cannot pay the minimum
gain are skipped, with the reason. A change is kept only if it beats the current best beyond the noise.
Kept changes re-open the knobs they interact with (INTERACTIONS). The plan ends with the ablation (each changed
knob measured beside the winner without it) and the confirmation: baseline and winner measured again side by side.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass
from typing import Any

from .. import knobs
from ..analysis import breakeven, restart
from ..collectors import cuda_memory
from ..fmt import fmt_bytes
from ..probe.result import ProbeResult
from .base import Outcome, PlanContext, Planner
from . import compare, compile_cost, pairing
from .compare import DUEL_FROM, LOADER_DUEL_FROM, MAX_DUELS, MAX_DUELS_AMPLE, MIN_DUELS_UNDECIDED
from .ratios import settings_key
from .keep import LOADER_BOUND, MIN_GAIN, without
from .session import Session

MIN_DATA_WAIT = 0.03  # below this share of the step spent waiting for data, more loader workers cannot pay MIN_GAIN
MIN_COPY_SHARE = 0.03  # likewise for host-to-device copies and pinned memory
MAX_VISITS = 3  # how often one knob may be (re-)explored: bounds the re-opening
DEFAULT_MAX_BATCH = 4096
WORKER_LADDER = (0, 1, 2, 4, 8, 16, 32, 64)  # when SEARCH does not name num_workers: I/O-bound loaders pay past cores
# A ladder stops at the first step that gains less than MIN_GAIN, except the loader ladder while its best probe still
# waits for data LOADER_BOUND of the step or more: throughput over workers is not monotonic there (one worker only
# moves the loading out of the training process; a middle count can starve the training threads of cores while many
# more workers, mostly asleep on I/O, pay again), so it stops only after two steps in a row that do not beat the best,
# one of them judged in a duel, or after SCREENED_STALE steps judged by screening alone: a screen compares two
# single probes, each in its own moment of the machine. One augment_cpu run screened 1 and 2 workers at 0.72x and
# 0.70x of the baseline's probe, where other runs' duels measured 2 workers 1.4-1.65x faster than the baseline.
SCREENED_STALE = 4
# A ladder's first rung decides alone whether the ladder goes anywhere, so its screen earns a duel from
# LOADER_DUEL_FROM, not DUEL_FROM: one hf_transformer run screened batch 16 at 0.89x of 8, in a slow moment of the
# machine, and stopped there; its twin run's duel measured 16 at 1.17x of 8, and went on to 32.
BISECT_RESOLUTION = 8  # bisection stops when the gap is at most max(8, an eighth of the largest batch that fit)

# Rough speedups of the compute part of a step, used only to order the knobs and to skip those that cannot pay
# when the step is dominated by something else. Measurements decide; these never enter a recommendation.
COMPUTE_SPEEDUP = {"amp": 1.6, "channels_last": 1.1, "channels_last_amp": 1.2,
                   "batch_size": 1.2, "cudnn_benchmark": 1.1, "compile": 1.15, "matmul_precision": 1.5,
                   "optimizer_impl": 1.1}

# A value not tried once the value that does all it does and more was measured on top of the same settings: the
# fused optimizer does the foreach one's batching over parameters and also fuses each update's arithmetic. Where
# both were measured it never lost to foreach (hf_transformer: foreach 0.96x, fused 1.04x; varlen_transformer:
# foreach 1.00x, fused 1.03-1.08x; augment_cpu: foreach 1.06x, fused 1.57x), and at a 1- or 2-minute budget the
# foreach probe and its duels cost a confirmation round or the compile probe.
SUBSUMED = {("optimizer_impl", "foreach"): "fused"}

# Exploration order when prospects tie, and the knobs this planner knows.
ORDER = ("num_workers", "amp", "channels_last", "batch_size", "checkpointing", "pin_memory", "cudnn_benchmark",
         "compile", "matmul_precision", "optimizer_impl", "persistent_workers", "prefetch_factor")

# A kept change re-opens these knobs: AMP frees memory (a larger batch may fit) and changes which memory format is
# fastest; checkpointing is worth only the batch it makes fit; a larger batch loads the input pipeline more and
# shifts the step from per-step overhead to compute, where precision and memory format show; once the loader keeps
# up, faster compute shows; workers kept alive across epochs no longer pay a start-up per epoch that grows with their
# number, so more of them may pay (one io_bound run: 32 workers read 1.00-1.09x of 16 in three duels while each
# epoch started them anew, kept 16, then persistent workers: 16.5x over its baseline, re-measured, where its twin
# run's 32 persistent workers re-measured 27.2x).
LADDERS = ("batch_size", "num_workers")  # knobs walked rung by rung: a rung kept late may have more above it
INTERACTIONS = {
    "amp": ("batch_size", "channels_last"),
    "checkpointing": ("batch_size",),
    "batch_size": ("num_workers", "amp", "channels_last"),
    "num_workers": ("amp", "channels_last", "batch_size", "persistent_workers", "prefetch_factor"),
    "persistent_workers": ("num_workers",),
}


@dataclass
class Prospect:
    speedup: float  # what the knob could plausibly still gain on top of the current best
    why_not: str | None = None  # set when it is not worth a probe


class AdaptivePlanner(Planner):
    strategy = "adaptive"

    def __init__(self, ctx: PlanContext, session: Session):
        super().__init__(ctx, session)
        self.visits: Counter[str] = Counter()
        self.dense_frac: float | None = None  # from the baseline's profile, when it was profiled (search())
        self.optimizer_frac: float | None = None  # likewise
        self.worker_cap: int | None = None  # the loader workers the cores can feed, when the baseline loaded in-process
        self.load_s: float | None = None  # seconds to load one sample, when the baseline loaded in-process
        self.rejudge: set[str] = set()  # ladders whose answer a later kept change put in question: explored first
        self.follow: set[str] = set()  # knobs whose prospect the last exploration measured: explored next
        self.moved_from: ProbeResult | None = None  # the best before a move to a tie (`_tie_move`), once made
        self.tie: ProbeResult | None = None  # where that move went
        session.ledger.keeps_as_it_goes = True  # a candidate it did not keep is not the confirmation's to reckon
        self.knobs = [k for k in ORDER if ctx.explore is None or k in ctx.explore]  # what this plan explores
        if ctx.explore is not None:
            self.decisions.append(f"exploring only {', '.join(self.knobs) or 'nothing'} (--knobs)")

    def search(self, base: ProbeResult) -> ProbeResult:
        s = self.session
        self._record_not_applicable()
        profile = base.extra.get("profile") or {}
        self.dense_frac, self.optimizer_frac = profile.get("dense_frac"), profile.get("optimizer_frac")
        if self.dense_frac is not None:
            self.decisions.append(f"the baseline's profile: {self.dense_frac:.0%} of its compute (the step outside "
                                  "data loading) in matmuls, convolutions, attention and RNN cells, the part a "
                                  "precision knob speeds up" + (f"; {self.optimizer_frac:.0%} in the optimizer's "
                                  "steps, the part a fused optimizer shortens" if self.optimizer_frac is not None
                                  else ""))
        self.worker_cap = self._worker_cap(base)
        self.load_s = self._load_s(base)
        current, done = base, set()
        while True:
            todo = [k for k in self.knobs if k not in done and self.visits[k] < MAX_VISITS]
            prospects = {k: self.prospect(k, current) for k in todo}
            live = {k: p for k, p in prospects.items() if p.why_not is None}
            if not live:
                found = self._second_look(current)
                if found is not None:  # kept: what it interacts with may pay again, and a ladder may go on
                    changed = [k for k in self.knobs if found.settings[k] != current.settings[k]]
                    done.difference_update([k for k in changed if k in LADDERS] +
                                           [k for c in changed for k in INTERACTIONS.get(c, ())])
                    current = self._keep(current, found)
                    self.rejudge |= self._questioned(changed, current)
                    continue
                moved = self._tie_move(current, prospects) if self.moved_from is None else None
                if moved is not None:
                    self.moved_from, current = current, moved
                    continue
                self._ruled_out(prospects, current)
                return self._settled(current)
            if not s.budget.affordable():
                # the knobs its prospects had already ruled out say why too (a CNN on an H200 ended by the budget
                # with amp neither tried nor mentioned: its GPU sat idle 92% of the step)
                self._ruled_out(prospects, current)
                s.ledger.unexplored.extend(f"{name}: over budget" for name in live)
                return self._settled(current)
            # a ladder in question first, then what the last exploration measured the prospect of (`_follow`), else
            # the most promising knob (first in ORDER on ties); compile where it pays most for what it costs
            # (`_compile_waits`)
            name = next((k for k in live if k in self.rejudge), None) or next(
                (k for k in live if k in self.follow), None) or max(
                self._compile_waits(live, current), key=lambda k: live[k].speedup)
            done.add(name)
            self.rejudge.discard(name)
            self.follow.clear()
            self.visits[name] += 1
            found = self._explored(name, current, base)
            if found is not current:
                done.difference_update(INTERACTIONS.get(name, ()))
                self.rejudge |= self._questioned([name], found)
                current = found
            self.follow = self._follow(name, current)

    def _follow(self, explored: str, best: ProbeResult) -> set[str]:
        """The knobs to explore next after `explored`, where it left `best`: after the loader ladder, keeping
        `best`'s workers alive across epochs, where what its epoch starts cost (`_restart_prospect`, measured on
        `best` itself, where the compute knobs' prospects are rough speedups that outrank it) could be told from
        the noise in the duels in turn it would get (`compare.least_told_in_turn`). A 2-minute lightning_module run
        kept 4 workers, then spent 70 s on bf16, medium, prefetch_factor and a batch ladder, none beyond the noise,
        and never reached persistent workers, which its 5-minute run kept (4.74x over the baseline to 4 workers'
        4.38x; its epoch starts bound them at 1.13-1.19x, so the bar sits in that range: a run at 1.132x was not
        followed, and neither order told their 1.07-1.08x at 1 or 2 minutes). A smaller bound waits its turn: a
        1-minute augment_cpu run (2 workers, epoch starts bounding them at 1.08x) spent 26 s on three duels in turn
        that could not tell them, and its batch ladder and fused optimizer, which its 3-minute run kept, went over
        budget (22.4% regret; three runs with the bar kept batch 128 at 1 minute: 0.6-3.2%)."""
        if explored != "num_workers" or not best.settings["num_workers"] or best.settings["persistent_workers"]:
            return set()
        prospect = self.prospect("persistent_workers", best)
        if prospect.why_not is None and prospect.speedup >= compare.least_told_in_turn(self._duels_in_turn(best)):
            return {"persistent_workers"}
        return set()

    def _duels_in_turn(self, best: ProbeResult) -> int:
        """The most duels in turn a loader change on top of `best` gets: MAX_DUELS_AMPLE against the baseline (see
        compare.py), MAX_DUELS otherwise."""
        return MAX_DUELS_AMPLE if self.session.ledger.is_baseline(best) else MAX_DUELS

    def _compile_waits(self, live: dict[str, Prospect], current: ProbeResult) -> list[str]:
        """The knobs to pick the next one from: `live`, but without compile while another live knob pays more for
        what it costs: the log of its prospect per second of a duel, compile's duel with its compiling added
        (compile_cost.allowance: twice an earlier run's compile here, else a 30 s guess). A compiled probe
        compiles anew in every fresh process, so once compile is kept every later probe and each confirmation
        round pays for it: a 2-minute raw_sensor_mlp run kept compile first at 1.05x, then spent 12-18 s a probe
        on the fused optimizer (1.26x; its optimizer steps take 35% of the compute) and the loader. Always last,
        compile went over budget in every 1-minute run of the three fixtures whose 3-minute runs kept it
        (hf_transformer, hf_trainer at 13-17% regret), after a fused optimizer duel that read 1.00x where the
        optimizer's step takes 7% of the compute. On a cache this machine has compiled the workload into, compile
        takes 2-5 s (compile_cost.py)."""
        others = [k for k in live if k != "compile"]
        if "compile" not in live or not others:
            return list(live)
        duel_s = max(self.session.budget.pair_s(), 1e-3)
        mode = min(self.alternatives("compile", current), default="default", key=lambda v: v != "default")
        extra_s = compile_cost.allowance(self.ctx.workload_sha256, self.ctx.device.type, mode)[0]
        best = max(others, key=lambda k: live[k].speedup)
        pays = math.log(live["compile"].speedup) / (duel_s + extra_s) > math.log(live[best].speedup) / duel_s
        return list(live) if pays else others

    def _questioned(self, changed: list[str], best: ProbeResult) -> set[str]:
        """The ladders that kept changes to `changed` re-open whose earlier walk measured past `best`'s value: their
        answer was reached without the change just kept, which may turn it (the quick start's 32 workers read 0.56x
        of 16 while each epoch started them anew, and 1.25x of 16 once persistent workers kept them). Re-opened
        first, before the budget goes to other knobs, so the recommendation is not left beside a comparison made at
        other settings."""
        reopened = {k for c in changed for k in INTERACTIONS.get(c, ()) if k in LADDERS and k in self.knobs}
        return {k for k in reopened
                if any(p.ok and p.settings[k] > best.settings[k] for p in self.session.ledger.probes)}

    def _explored(self, name: str, current: ProbeResult, base: ProbeResult) -> ProbeResult:
        """Explore `name` on top of `current`; the new best where a value beats `current` beyond the noise (kept,
        with its decision), else `current`."""
        s = self.session
        before = len(s.ledger.probes)
        found = self.explore(name, current)
        # A ladder keeps each value that beats the one before it; noise can add up over a chain of such wins
        # (augment_cpu: 2 -> 3 -> 4 workers, each a win, measured 1.02x [0.86, 1.24] over 2 workers). A chain
        # of lockstep wins whose product clears the noise stands; any other is checked against the start.
        chain = compare.chained_gain(s.ledger, current, found) if found is not current else None
        chained = chain is not None and compare.clears(chain)
        if found is not current and not chained and not s.beats(current, found):
            self.decisions.append(f"{name}: {knobs.describe(found.settings, current.settings)} beat the "
                                  f"values before it, but not the start beyond the noise "
                                  f"({compare.describe_gain(s.ledger, current, found)})")
            found = current
        if found is current:
            self.decisions.append(self._nothing_beat(name, current, base, s.ledger.probes[before:]))
            return current
        self.decisions.append(f"{name}: kept {knobs.describe(found.settings, current.settings)} "
                              f"({compare.describe_gain(s.ledger, current, found, chained)})")
        return self._keep(current, found, chained)

    def _keep(self, current: ProbeResult, found: ProbeResult, chained: bool = False) -> ProbeResult:
        """`found` kept over `current`: the ledger notes the gain it was kept on (over the chain of lockstep wins
        where `chained`) and holds it as the best so far. Returns `found`."""
        ledger = self.session.ledger
        gain = compare.chained_gain(ledger, current, found) if chained else compare.gain(ledger, current, found)
        ledger.note_keep(current, found, gain)
        ledger.keep_best(found)
        return found

    def _ruled_out(self, prospects: dict[str, Prospect], current: ProbeResult) -> None:
        """Knobs left untried because their prospect could not gain enough: a decision and an unexplored entry."""
        for name, p in prospects.items():
            if p.why_not and self.alternatives(name, current):
                self.decisions.append(f"{name}: skipped: {p.why_not}")
                self.session.ledger.unexplored.append(f"{name}: {p.why_not}")

    @staticmethod
    def _nothing_beat(name: str, current: ProbeResult, base: ProbeResult, new: list[ProbeResult]) -> str:
        """The decision for a knob whose exploration kept nothing: beaten, or never measured (budget, failures)."""
        tried = [p for p in new if p.settings.get(name) != current.settings[name]]
        if any(p.ok and p.measured for p in tried):
            return f"{name}: no value beat {knobs.describe(current.settings, base.settings)} beyond the noise"
        if tried:  # a probe cut short by the budget, or one that failed: no figure to decide on
            return f"{name}: nothing measured ({', '.join(f'{p.id} {p.status.value}' for p in tried)})"
        return f"{name}: nothing measured: over budget"

    def _second_look(self, current: ProbeResult) -> ProbeResult | None:
        """With nothing left to explore, the comparisons against the best that are still open (`open_gains`: a
        gain of at least MIN_GAIN at the median whose CI reaches 1, or a CI that cannot tell) earn the further
        duels a comparison against the baseline earns (compare.MAX_DUELS_AMPLE), and a gain still promising after
        them more (compare.MAX_DUELS_SECOND_LOOK), with what is left of the budget before the confirmation: the
        plan has nothing else to spend it on. One lstm_collate run read batch 256
        over 128 not beyond the noise in three lockstep duels, kept 128 and ended at 76 s of its 180; its twin run
        kept 256, 1.06x faster re-measured. Returns the candidate that now beats the best, or None."""
        s, ledger = self.session, self.session.ledger
        for candidate in compare.open_gains(ledger, current):
            if not self._usable(candidate) or self.ran_eagerly(candidate):  # an eager compile's gain is noise
                continue
            before = compare.describe_gain(ledger, current, candidate)
            asked = compare.duel_count(ledger, current, candidate)
            won = s.beats(current, candidate, second_look=True)
            after = compare.describe_gain(ledger, current, candidate)
            change = knobs.describe(candidate.settings, current.settings)
            if compare.duel_count(ledger, current, candidate) == asked:  # the budget afforded no further duel
                s.ledger.unexplored.append(f"{change}: a second look at its open gain ({before}) over budget")
                return None
            self.decisions.append(f"second look: {change} {'kept' if won else 'still not beyond the noise'} "
                                  f"({after}; before: {before})")
            if won:
                return candidate
        return None

    def _tie_move(self, current: ProbeResult, prospects: dict[str, Prospect]) -> ProbeResult | None:
        """With nothing left to explore: a setting measured against `current` in a duel that reads a tie (its CI
        holds 1, its median from DUEL_FROM) and beside which knobs `current`'s profile ruled out could pay, to
        explore those on top of; None where there is none, or no budget. The tie is not kept for itself: it stays
        in the recommendation only with a change kept beside it (`_settled`). On 2 cores augment_cpu's 2 loader
        workers read 0.98x-1.11x of none in rounds in turn, the baseline's step waits for data 96% of the time
        and so rules out every compute knob, and coordinate ascent ended there (1- and 2-minute runs kept the
        baseline); beside the 2 workers the step waits 39-47%, and its 5-minute run, which had kept them,
        measured batch 128 and the fused optimizer 1.73x over the baseline."""
        ledger, key = self.session.ledger, settings_key(current.settings)
        ruled = [k for k, p in prospects.items() if p.why_not]
        best = None
        for (a, b), pairs in ledger.duels.items():
            candidate = ledger.seen(dict(b)) if a == key and b != key else None
            if candidate is None or not candidate.ok or not self._usable(candidate):
                continue
            median, low, high = compare.gain(ledger, current, candidate)
            if not (median >= DUEL_FROM and low <= 1.0 <= high):
                continue
            opened = [k for k in ruled if self.prospect(k, candidate).why_not is None]
            if opened and (best is None or (len(opened), median) > (len(best[1]), best[2])):
                best = (candidate, opened, median)
        if best is None:
            return None
        candidate, opened = best[0], best[1]
        if not self.session.budget.affordable():  # cut by the budget: more time would have tried it
            ledger.unexplored.append(f"{', '.join(opened)} beside {knobs.describe(candidate.settings, current.settings)}"
                                     f" (a tie with {knobs.describe(current.settings, self.ctx.baseline)}): over budget")
            return None
        wait, was = candidate.data_wait_frac() or 0.0, current.data_wait_frac() or 0.0
        self.decisions.append(
            f"tie: {knobs.describe(candidate.settings, current.settings)} reads a tie with "
            f"{knobs.describe(current.settings, self.ctx.baseline)} "
            f"({compare.describe_gain(ledger, current, candidate)}); beside it the step waits for data {wait:.0%} "
            f"of the time, not {was:.0%}, so {', '.join(opened)} may pay there: explored on top of it, which stays "
            "only with a change kept beside it")
        self.tie = candidate
        return candidate

    def _settled(self, current: ProbeResult) -> ProbeResult:
        """`current`, or the best before the move to a tie (`_tie_move`) where nothing was kept beside the tie."""
        if self.moved_from is not None and current is self.tie:
            self.decisions.append(f"tie: nothing kept beside "
                                  f"{knobs.describe(current.settings, self.moved_from.settings)}: back to "
                                  f"{knobs.describe(self.moved_from.settings, self.ctx.baseline)}")
            return self.moved_from
        return current

    def _record_not_applicable(self) -> None:
        """Not-applicable values become skipped probes with their reason, so the report lists them."""
        ctx = self.ctx
        for name in self.knobs:
            for value in self._values(name):
                reason = knobs.not_applicable(name, value, ctx.workload, ctx.device)
                if reason and value != ctx.baseline[name]:
                    self.session.skip({**ctx.baseline, name: value}, f"knob:{name}", reason)

    def _worker_cap(self, base: ProbeResult) -> int | None:
        """How many loader workers the cores can keep busy, from the baseline's in-process loading: a worker whose
        fetch keeps a core busy a share c of its time needs c of a core, so past cores / c more workers only queue
        for the CPU and take it from the training threads (torch's DataLoader warns past the core count for the
        same reason). None when not known: the baseline used workers (the main thread then only waits), the cores
        are not known, or DDP ranks share them."""
        c, cores = base.extra.get("fetch_cpu_frac"), self.ctx.device.cpu_cores
        if c is None or not cores or self.ctx.device.world_size > 1 or "num_workers" not in self.knobs:
            return None
        cap = knobs.workers_the_cores_feed(c, cores)
        if any(v > cap for v in self._values("num_workers")):
            self.decisions.append(f"num_workers: the baseline's batches kept its loading thread on a CPU {c:.0%} "
                                  f"of the time, so about {cap} workers fill the {cores} cores: the worker ladder "
                                  "goes no further")
        return cap

    def _load_s(self, base: ProbeResult) -> float | None:
        """Seconds one sample takes to load (read, decode, collate), from the baseline: without workers its whole
        loading is the step's data wait. None where the baseline used workers (its wait is only what they lag) or a
        step is a script's optimizer step (it may span several batches)."""
        waits = base.raw.get("data_wait_s") or []
        if base.settings["num_workers"] != 0 or not waits or (self.ctx.workload.extra or {}).get("script"):
            return None
        return sum(waits) / (len(waits) * base.settings["batch_size"])

    def _within_cores(self, values: list) -> tuple[list, list]:
        """`values` (worker counts, ascending) split into those worth a probe, up to the cap, and the rest. The
        smallest listed count past the cap is worth one too where the largest within it leaves the cores room for
        MIN_GAIN more (it loads at most as fast as the cap's workers would): io_bound on an Intel Xeon read its
        loading thread on a CPU 7% of the time, a cap of 28, and its ladder stopped at 16 where 32 workers, mostly
        asleep on storage, had paid 1.6-1.75x over 16 on the machines where the cap let them be tried; and where no
        count is listed within the cap, the smallest past it."""
        if self.worker_cap is None:
            return values, []
        cap, candidates = self.worker_cap, sorted(v for v in self._values("num_workers") if v > 0)
        within, past = [v for v in candidates if v <= cap], [v for v in candidates if v > cap]
        limit = past[0] if past and (not within or cap >= within[-1] * (1 + MIN_GAIN)) else cap
        return [v for v in values if v <= limit], [v for v in values if v > limit]

    # --- which values and how promising ---------------------------------------------------------------------------

    def _values(self, name: str) -> list:
        """Candidate values: SEARCH's, else the knob's own candidates (ladders are generated), plus the baseline's."""
        if name in self.ctx.search:
            values = list(self.ctx.search[name])
        elif name == "num_workers":
            values = list(WORKER_LADDER)
        elif name == "batch_size":
            bound = min(DEFAULT_MAX_BATCH, self.ctx.workload.dataset_len or DEFAULT_MAX_BATCH)
            values, v = [], self.ctx.baseline["batch_size"]
            while v <= bound:
                values.append(v)
                v *= 2
        else:
            values = list(knobs.KNOBS[name].candidates)
        if self.ctx.baseline[name] not in values:
            values.append(self.ctx.baseline[name])
        return values

    def alternatives(self, name: str, current: ProbeResult) -> list:
        """Applicable values of `name` other than the current one."""
        ctx = self.ctx
        return [v for v in self._values(name) if v != current.settings[name]
                and not knobs.not_applicable(name, v, ctx.workload, ctx.device, current.settings)]

    def prospect(self, name: str, current: ProbeResult) -> Prospect:
        """How much `name` could still gain over `current`, judged from what `current` measured."""
        if not self.alternatives(name, current):
            return Prospect(1.0, "no other applicable value to try")
        if name in ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor"):
            return self._loader_prospect(name, current)
        if name == "amp":
            # bf16 applies only where it is native (knobs.not_applicable); on a CPU that emulates it, what is left
            # to try is leaving a bf16 baseline, at least as promising
            return self._precision_prospect(name, current)
        if name == "channels_last":
            amp_on = current.settings["amp"] != "off"
            return self._through_compute(current, COMPUTE_SPEEDUP["channels_last_amp" if amp_on else "channels_last"])
        if name == "batch_size" and self.visits[name] and not self._batch_ups(current):
            return Prospect(1.0, "a re-opened batch ladder only climbs (what re-opened it makes room for a larger "
                                 "batch), and no larger batch is left")
        if name == "batch_size" and current.settings["num_workers"] > 0:
            # With loader workers a larger batch also amortises the per-batch hand-over from the workers, which
            # shows up as data wait: the wait does not bound it.
            return Prospect(COMPUTE_SPEEDUP[name])
        if name == "compile":
            return self._compile_prospect(current)
        if name == "optimizer_impl":
            return self._optimizer_prospect(current)
        if name in ("batch_size", "cudnn_benchmark"):
            return self._through_compute(current, COMPUTE_SPEEDUP[name])
        if name == "checkpointing":
            return self._checkpointing_prospect(current)
        if name == "matmul_precision":
            if current.settings["amp"] != "off":
                return Prospect(1.0, f"amp={current.settings['amp']} already runs the matmuls in 16 bits")
            return self._precision_prospect(name, current)
        return Prospect(1.0, "this planner does not know the knob")

    def _precision_prospect(self, name: str, current: ProbeResult) -> Prospect:
        """A precision knob's prospect: `_through_compute` on the dense share, sped up by the device's measured
        matmul roof of the knob's type over the current one's (`_roof_ratio`), else by COMPUTE_SPEEDUP's rough
        figure. Native is not fast: on an Intel Xeon with avx512_bf16 but no AMX, bf16 matmuls ran at 0.60x of
        float32's rate (143 vs 240 GFLOP/s), and the minute of hf_transformer and hf_trainer spent 10-17 s on
        lockstep pairs that read bf16 0.58-0.60x and matmul_precision=medium 0.55-0.72x."""
        roof = self._roof_ratio(name, current)
        prospect = self._through_compute(current, roof[0] if roof else COMPUTE_SPEEDUP[name], precision=True)
        if roof is None or roof[0] >= 1 + MIN_GAIN:
            return prospect
        ratio, theirs, here = roof
        peaks = self.ctx.device.matmul_peaks
        return Prospect(prospect.speedup, f"{theirs} matmuls run at {ratio:.2f}x the rate of {here} ones on this "
                                          f"device (its measured roofs: {peaks[theirs] / 1e9:,.0f} and "
                                          f"{peaks[here] / 1e9:,.0f} GFLOP/s), so it cannot speed up the matmuls")

    def _roof_ratio(self, name: str, current: ProbeResult) -> tuple[float, str, str] | None:
        """(the best measured matmul roof among `name`'s other values over `current`'s, their dtype, `current`'s),
        or None where a roof is missing, or amp on a model with convolutions (their kernels are not the matmul's).
        matmul_precision changes only the matmuls, convolutions or not: a 2-minute lightning_module run (a CNN)
        spent a lockstep pair on medium, 0.98x, where bf16 matmuls ran at 0.60x of float32's."""
        peaks = self.ctx.device.matmul_peaks or {}
        if not peaks or (name == "amp" and self.ctx.workload.conv_layers):
            return None
        cuda = self.ctx.device.type == "cuda"

        def dtype(settings: dict[str, Any]) -> str:  # what the matmuls compute in
            if settings["amp"] != "off":
                return settings["amp"]
            return {"highest": "fp32"}.get(settings["matmul_precision"], "tf32" if cuda else "bf16")

        here = dtype(current.settings)
        theirs = {dtype({**current.settings, name: v}) for v in self.alternatives(name, current)}
        if here not in peaks or not theirs or any(t not in peaks for t in theirs):
            return None
        best = max(theirs, key=lambda t: peaks[t])
        return peaks[best] / peaks[here], best, here

    def _through_compute(self, current: ProbeResult, speedup: float, precision: bool = False) -> Prospect:
        """`speedup` on the compute part of `current`'s step (the part outside waiting for data); a precision
        knob's only on its dense share (`_dense_at`)."""
        wait = current.data_wait_frac() or 0.0
        dense, dense_where = self._dense_at(current) if precision else (None, "")
        if dense is not None:
            speedup = 1 / ((1 - dense) + dense / speedup)
        bound = 1 / (wait + (1 - wait) / speedup)
        if bound >= 1 + MIN_GAIN:
            return Prospect(bound)
        dense_note = f" and {dense:.0%} of the rest is matmuls and convolutions{dense_where}" \
            if dense is not None else ""
        return Prospect(bound, f"the step is {wait:.0%} waiting for data{dense_note}, so faster compute could "
                               f"gain at most {bound - 1:.0%}")

    def _optimizer_prospect(self, current: ProbeResult) -> Prospect:
        """A fused optimizer shortens only the optimizer's steps: bounded by their share of the compute in the
        baseline's profile (`optimizer_frac`), carried to `current`'s steps (a fixed cost per step, its share falls
        as the step grows), as if they took no time; COMPUTE_SPEEDUP's rough figure where nothing was profiled.
        Where both were measured, the gain followed that share: raw_sensor_mlp 35% of the compute, 1.26x; lstm_collate
        11%, 1.07x; hf_transformer 7%, 1.00-1.04x; cnn at batch 64 + channels_last 1.6%, 1.01x [0.96, 1.06] over four
        lockstep rounds (Intel Xeon, 2 cores)."""
        if self.optimizer_frac is None:
            return self._through_compute(current, COMPUTE_SPEEDUP["optimizer_impl"])
        share, where = self._carried(self.optimizer_frac, current, fixed=True)
        prospect = self._through_compute(current, 1 / (1 - min(share, 0.99)))
        if prospect.why_not is None:
            return prospect
        return Prospect(prospect.speedup, f"the optimizer's steps take {share:.1%} of the compute{where}: a fused "
                                          f"optimizer could gain at most {prospect.speedup - 1:.1%}")

    def _compile_prospect(self, current: ProbeResult) -> Prospect:
        """compile speeds up the compute part (`_through_compute`); where --train-steps states the run, it is not
        tried where even that bound would save less over the run than compiling takes at least."""
        prospect, steps = self._through_compute(current, COMPUTE_SPEEDUP["compile"]), self.ctx.train_steps
        if prospect.why_not or not steps or not current.step_s:
            return prospect
        run = breakeven.run_steps(steps, self.ctx.baseline["batch_size"], current.settings["batch_size"])
        saved = breakeven.most_saved_s(run, statistics.median(current.step_s), prospect.speedup)
        if saved >= breakeven.COMPILE_MIN_S:
            return prospect
        return Prospect(1.0, f"the {steps:,} steps of the run --train-steps states would save at most {saved:.1f} s "
                             f"at the most compiling could gain here ({prospect.speedup:.2f}x), less than a compile "
                             f"takes (at least {breakeven.COMPILE_MIN_S:g} s)")

    def _loader_prospect(self, name: str, current: ProbeResult) -> Prospect:
        """What a loader knob could gain: bounded by the share of `current`'s step spent waiting for data (or
        copying to the device, for pinned memory)."""
        wait = current.data_wait_frac() or 0.0
        if name == "num_workers":
            if wait < MIN_DATA_WAIT:
                return Prospect(1.0, f"the step waits for data only {wait:.1%} of the time: more loader workers "
                                     f"cannot gain {MIN_GAIN:.0%}")
            untold = self._untold_workers(current)
            if untold:
                return Prospect(1.0, untold)
            if self.visits[name] and not self._worker_ups(current):
                return Prospect(1.0, "a re-opened loader ladder only climbs (a larger batch or faster compute asks "
                                     "more of the loader), and no larger worker count is left"
                                     + (" that the cores can feed" if self.worker_cap is not None else ""))
            return Prospect(1 / (1 - 0.9 * wait))
        if name == "pin_memory":
            copy = current.copy_frac() or 0.0
            if copy < MIN_COPY_SHARE:
                return Prospect(1.0, f"host-to-device copies take only {copy:.1%} of the step")
            return Prospect(1 / (1 - 0.5 * copy))
        if name == "persistent_workers":
            return self._restart_prospect(current)
        if wait < MIN_DATA_WAIT:  # prefetch_factor
            return Prospect(1.0, f"the step waits for data only {wait:.1%} of the time: a deeper prefetch "
                                 f"queue cannot gain {MIN_GAIN:.0%}")
        workers = current.settings["num_workers"]
        if self.worker_cap is not None and workers >= self.worker_cap:
            # a deeper queue smooths a loader's bursts; it gives no more CPU to one that loads on every core (no
            # augment_cpu run, at 1, 2 or 5 minutes, kept prefetch_factor=4 beside 2 workers)
            return Prospect(1.0, f"the {workers} loader workers already load on every core the cores can feed "
                                 "(see num_workers): a deeper prefetch queue gives them no more CPU")
        return Prospect(1 / (1 - 0.5 * wait))

    def _untold_workers(self, best: ProbeResult) -> str | None:
        """Why more loader workers than `best`'s are not worth a rung, or None. They can only shorten its wait for
        data, so they gain at most 1/(1 - its share of the step), and a loader rung is compared in turn
        (`keep.together`) in at most MAX_DUELS duels (MAX_DUELS_AMPLE against the baseline): where even those
        could not keep the most it can gain (`compare.least_told_in_turn`), its duels would only spend the budget.
        A 1-minute hf_trainer run screened 4 workers and dueled them twice in turn against 2, both waiting 8% of
        the step for data: 18 s of its 60 (its screen 3.7 s, two rounds 14.6 s), and batch 32 then had one screen."""
        wait = best.data_wait_frac() or 0.0
        ceiling = 1 / (1 - wait)
        duels = self._duels_in_turn(best)
        told = compare.least_told_in_turn(duels)
        if ceiling >= told:
            return None
        digits = 2 if f"{ceiling:.2f}" != f"{told:.2f}" else 3  # "at most 1.10x, below the 1.10x" reads false
        return (f"the step waits for data {wait:.1%} of the time at num_workers={best.settings['num_workers']}: "
                f"more workers could gain at most {ceiling:.{digits}f}x, below the {told:.{digits}f}x that {duels} "
                "duels in turn can tell from the noise")

    def _dense_at(self, current: ProbeResult) -> tuple[float | None, str]:
        """The baseline profile's dense share of the compute, carried to `current`'s batch size (`_carried`), and
        where it was carried from ('' where not carried)."""
        return (None, "") if self.dense_frac is None else self._carried(self.dense_frac, current)

    def _carried(self, share: float, current: ProbeResult, fixed: bool = False) -> tuple[float, str]:
        """A share of the baseline's compute carried to `current`'s batch size, and where it was carried from ('' where
        not carried). A dense kernel's time grows with the batch (its FLOPs do), a fixed cost per step (`fixed`:
        the optimizer's step) does not: with d of c0 seconds of compute at batch b0, about d·c0·k (fixed: d·c0) of
        the c seconds measured at k·b0. On an H200 the cnn's GPU idled 91% of a batch-32 step (dense 7% of 6.5 ms
        of compute), and batch 128 computed in 6.1 ms: bf16 was judged on 7% where about 28% applied, and went
        untried. Compute that grew faster than the batch (loader workers taking the cores from the training thread)
        slows these shares' own time too, so a growing share is never carried below the profile's, and a fixed one
        never below what the batch alone makes of it, d / (d + (1 − d)·k): augment_cpu's optimizer, 31% of its
        compute at batch 32, read 1.0% by the step times at batch 128 beside 2 workers, 10% by the batch, and the
        fused optimizer measured 1.06x [1.00, 1.12] there."""
        base = self.session.ledger.baseline
        if base is None or current.settings["batch_size"] == base.settings["batch_size"]:
            return share, ""
        c0, c = (compare.compute_s(p) / len(p.step_s) if p.step_s else 0.0 for p in (base, current))
        if c0 <= 0 or c <= 0:
            return share, ""
        k = current.settings["batch_size"] / base.settings["batch_size"]
        if fixed:
            timed, batched = share * c0 / c, share / (share + (1 - share) * k)
            carried, how = (timed, "the step times") if timed >= batched else (batched, "the batch")
        else:
            carried, how = min(1.0, share * c0 * k / c), "the batch and the step times"
            if carried <= share:
                return share, ""
        return carried, (f" at batch_size={current.settings['batch_size']} (the baseline's {share:.0%} at "
                         f"{base.settings['batch_size']}, scaled by {how})")

    def _restart_prospect(self, current: ProbeResult) -> Prospect:
        """persistent_workers saves the worker start-up at every epoch: bounded by what the epoch starts cost the
        steps they slowed while measuring (`restart.restart_cost`). Not by their data wait alone: a new epoch also
        shuts the old workers down, which the wait does not hold (lightning_module at batch 64, 4 workers: those
        steps took 0.33-0.42 s, 0.17-0.20 s of it waiting for data, and 0.22-0.24 s with persistent workers, which
        measured 1.19x; at batch 16 the wait's share, 2.5-4.7% of the time, ranked them last and no 1- to
        3-minute run tried them, where keeping them measured 1.07x)."""
        s, starts = current.settings, current.extra.get("epoch_start_steps") or []
        cost = restart.restart_cost(current.step_s, starts, restart.refill_steps(s["num_workers"],
                                                                                  s["prefetch_factor"]),
                                    current.extra.get("epoch_steps"))
        if cost is None:
            return Prospect(1.0, "no epoch start was measured beside typical steps: what restarting the workers "
                                 "costs was not seen")
        if cost.bound < 1 + MIN_GAIN:
            return Prospect(cost.bound, f"{cost.starts} epoch start(s) while measuring cost {cost.share:.1%} of "
                                        f"the time: keeping workers alive cannot gain {MIN_GAIN:.0%}")
        return Prospect(cost.bound)

    def _checkpointing_prospect(self, current: ProbeResult) -> Prospect:
        """Checkpointing trades compute for memory: it can pay only when memory stopped a batch ladder that was
        still gaining, at the current batch size."""
        f = self.frontier
        if current.settings["checkpointing"]:
            return Prospect(1.0, "already on")
        if f is None:
            return Prospect(1.0, "no batch size ran out of memory, so there is no larger batch for it to make fit")
        if f["largest_ok"] != current.settings["batch_size"] or not f["still_gaining"]:
            return Prospect(1.0, f"throughput stopped growing below the memory limit (batch_size "
                                 f"{f['largest_ok']} fits): a larger batch would not pay for the recomputation")
        return Prospect(f["last_step_gain"])

    # --- exploring one knob ---------------------------------------------------------------------------------------

    def explore(self, name: str, current: ProbeResult) -> ProbeResult:
        if name == "batch_size":
            return self.batch_ladder(current)
        if name == "num_workers":
            return self.worker_ladder(current)
        if name == "checkpointing":
            return self.checkpointing(current)
        return self.choice(name, current)

    def choice(self, name: str, current: ProbeResult) -> ProbeResult:
        """Each other value of `name` on top of `current`, those another subsumes (SUBSUMED) last and only where
        it was not measured; the best that beats it."""
        best, eager = current, None  # eager: why a compile mode ran eagerly (the other modes would too)
        for value in sorted(self.alternatives(name, current), key=lambda v: (name, v) in SUBSUMED):
            if (wider := self._subsumed(name, value, current)) is not None:
                why = f"{name}={wider} does all it does, and was measured here"
                self.decisions.append(f"{name}={value}: not tried: {why}")
                self.session.ledger.unexplored.append(f"{name}={value}: {why}")
                continue
            if eager is not None:
                self.decisions.append(f"{name}={value}: not tried: {eager}")
                continue
            # a compile probe starts only where its compiling fits too (an earlier run's here, else a guess)
            extra_s, reckoned = compile_cost.allowance(self.ctx.workload_sha256, self.ctx.device.type, value) \
                if name == "compile" else (0.0, "")
            if not self.session.budget.affordable(extra_s=extra_s):
                self.session.ledger.unexplored.append(
                    f"{name}={value}: over budget" + (f" (its compiling reckoned at {reckoned})" if reckoned else ""))
                continue
            result = self.session.measure({**current.settings, name: value}, f"knob:{name}", best)
            if name == "compile" and (eager := self.ran_eagerly(result)) is not None:  # eager's speed, whatever
                # it read (only compile's own probes: a knob tried on top of a kept compile is judged by its speed)
                self.decisions.append(f"{name}={value}: not kept: {eager}")
                continue
            if self._usable(result) and self.session.beats(best, result):
                best = result
        return best

    def _subsumed(self, name: str, value, current: ProbeResult):
        """The value subsuming `value` (SUBSUMED) where it is `current`'s or was measured on top of it, else None."""
        wider = SUBSUMED.get((name, value))
        if wider is None:
            return None
        if current.settings[name] == wider:
            return wider
        seen = self.session.ledger.seen({**current.settings, name: wider})
        return wider if seen is not None and seen.ok and seen.measured else None

    def _worker_ups(self, current: ProbeResult) -> list:
        """The larger worker counts worth a probe on top of `current` (the cores can feed them)."""
        start = current.settings["num_workers"]
        return self._within_cores(sorted(v for v in self.alternatives("num_workers", current) if v > start))[0]

    def worker_ladder(self, current: ProbeResult) -> ProbeResult:
        start = current.settings["num_workers"]
        values = sorted(self.alternatives("num_workers", current))
        ups = self._worker_ups(current)
        for v in values:
            why = f"num_workers={v}: more than the cores can feed"
            if v > start and v not in ups and why not in self.session.ledger.unexplored:  # the ladder may be re-opened
                self.session.ledger.unexplored.append(why)
        best = self._walk_up("num_workers", current, ups)
        # More did not help: maybe fewer do (a baseline oversubscribing the cores). Only on the first visit: a
        # re-opened ladder follows a larger batch or faster compute, which ask more of the loader, not less (one
        # augment_cpu run walked 2 -> 1 -> 0 workers again after batch 64 and 128: six probes, 25 s of its 180).
        if best is current and start > 0 and self.visits["num_workers"] <= 1:
            best = self._ladder("num_workers", current, [v for v in reversed(values) if v < start])
        return best

    def batch_ladder(self, current: ProbeResult) -> ProbeResult:
        start = current.settings["batch_size"]
        listed = "batch_size" in self.ctx.search
        best = self._walk_up("batch_size", current, self._batch_ups(current))
        if best is current and listed and self.visits["batch_size"] <= 1:  # smaller listed batches: see _batch_ups
            values = sorted(self.alternatives("batch_size", current))
            best = self._ladder("batch_size", current, [v for v in reversed(values) if v < start])
        f = self.frontier
        if (f and not listed and f["still_gaining"] and f["largest_ok"] == best.settings["batch_size"]
                and f["settings"] == without(best.settings, "batch_size")):
            best = self.bisect(best)
        return best

    def _batch_ups(self, current: ProbeResult) -> list:
        """The batch sizes above `current`'s: SEARCH's, else doubling up to the dataset or DEFAULT_MAX_BATCH. Smaller
        listed ones are tried only on the ladder's first visit: what re-opens it (less memory under AMP, workers that
        keep up, checkpointing) makes room for a larger batch, not a smaller one (a 1-minute tiny_batch_mlp run
        walked back to 256 after bf16 at 512, and had no time left for the fused optimizer)."""
        start = current.settings["batch_size"]
        if "batch_size" in self.ctx.search:
            return sorted(v for v in self.alternatives("batch_size", current) if v > start)
        bound = min(DEFAULT_MAX_BATCH, self.ctx.workload.dataset_len or DEFAULT_MAX_BATCH)
        return [start * 2**i for i in range(1, 13) if start * 2**i <= bound]

    def _walk_up(self, name: str, current: ProbeResult, ups: list) -> ProbeResult:
        """The ladder `name` walked up `ups` from `current`, in double steps where the budget is short (`_strided`,
        `_between`); the best probe."""
        rungs = self._strided(name, ups)
        best = self._ladder(name, current, rungs)
        return best if rungs == ups else self._between(name, best, ups, rungs)

    def _strided(self, name: str, ups: list) -> list:
        """A ladder's rungs to walk up: all of them where walking them all, a probe and its duel each
        (`_rung_probes`), would take at most half of what the budget leaves before the confirmation; else every
        other one from the second, and the largest, so each step is twice as large (4x on a doubling ladder) and
        a short budget reaches the ladder's far end, where the large gains are, and keeps time for the knobs
        after it: tiny_batch_mlp's 1-minute runs walked 8 and 16 of 8-512 and kept 16 (3.3x), and, once a
        ladder's rungs ran as lockstep pairs, all seven rungs to 512 in 27 s, leaving amp and the fused
        optimizer (another 2.3x) over budget; io_bound's walked 1 and 2 of up to 32 loader workers. Two rungs
        are one such step: augment_cpu's 1-minute run walked 1 loader worker (0.8x) before the 2 its cores could
        feed (1.5x), 13 s of its minute, and had none left for batch 128 and the fused optimizer, which pay
        beside them. Two rungs are stepped over on any budget: the step costs a probe only where the far rung
        loses, and the budget check let another 1-minute augment_cpu run walk 1 worker first (its baseline's
        probe, the one it reckons from, was short). `_between` then tries the rungs skipped above the best (with
        two, the first where the second lost)."""
        budget = self.session.budget
        two = len(ups) == 2 and budget.limit_s is not None
        if len(ups) < 2 or not two and budget.affordable(probes=self._rung_probes(name) * len(ups), confirming=True):
            return ups
        rungs = ups[1::2] + ups[-1:] if len(ups) % 2 else ups[1::2]
        why = "on a budget, the far one of two rungs first" if two else "the budget could not walk every rung"
        self.decisions.append(f"{name} ladder in double steps ({', '.join(map(str, rungs))} of "
                              f"{', '.join(map(str, ups))}): {why}")
        return rungs

    @staticmethod
    def _rung_probes(name: str) -> int:
        """The probes' time a rung of ladder `name` is reckoned at, doubled (`_strided`: walking every rung may take
        half of what is left): its screen and a duel beside the best, a lockstep pair's two side by side (one
        probe's time), a loader-worker rung's in turn (`keep.together`), MIN_DUELS_UNDECIDED rounds of two. A 1-minute
        hf_trainer run, reckoned at a lockstep rung's four, walked 1, 2 and 4 loader workers, three probes each
        with walls 2-3x its baseline's: 30 s of its minute, and amp was cut short by the budget."""
        duel = 2 * MIN_DUELS_UNDECIDED if name == "num_workers" else 1
        return 2 * (1 + duel)

    def _between(self, name: str, best: ProbeResult, ups: list, rungs: list) -> ProbeResult:
        """After a strided walk: the skipped rungs between the best and the next rung walked above it, as the
        budget allows; the skipped rungs no probe measured are listed (above the value kept: over budget)."""
        walked = best.settings[name]
        above = [r for r in rungs if r > walked]
        between = [v for v in ups if v not in rungs and walked < v < (above[0] if above else float("inf"))]
        if between:
            best = self._ladder(name, best, between)
        ledger, kept = self.session.ledger, best.settings[name]
        for v in ups:
            listed = any(u.startswith(f"{name}={v}: ") for u in ledger.unexplored)  # by _ladder's budget check
            if v not in rungs and not listed and ledger.seen({**best.settings, name: v}) is None:
                ledger.unexplored.append(f"{name}={v}: over budget (the ladder took double steps)" if v > kept else
                                         f"{name}={v}: below the value kept (the ladder took double steps)")
        return best

    def _ladder(self, name: str, current: ProbeResult, values: list) -> ProbeResult:
        """Walk `values` of `name` in order on top of `current`. Stops at a failure or the memory budget (recording
        the frontier), or at the plateau (`_plateau`). Returns the best probe; a later value replaces an earlier
        one only when it beats it beyond the noise."""
        s, best, previous, previous_gain, stale, dueled_stale = self.session, current, current, None, 0, 0
        steps, flat = [], None  # flat: the last rung up, while it did not beat the best
        workers = current.settings["num_workers"]  # batch rungs: raised where a rung's loading needed more
        for i, value in enumerate(values):
            settings = {**current.settings, name: value}
            if name == "batch_size":
                settings["num_workers"] = workers
            if not self._rung_fits(name, settings, previous, values[i:], best is previous, previous_gain):
                break
            result = s.measure(settings, f"ladder:{name}", best)
            steps.append(f"{value} ({result.status.value})")
            if not self._usable(result):
                cause = self._failure(result)
                if name == "batch_size":
                    self._set_frontier(previous, value, cause, best is previous, previous_gain)
                margin = self._inside_margin(result) if result.ok else None
                self.notes.append(f"{name}={value} {margin}: {name}={best.settings[name]} kept instead" if margin
                                  else f"{name} ladder stopped at {name}={value}: {cause}")
                flat = None
                break
            if name == "batch_size":
                result = self._fed(result, best, steps)
                workers = result.settings["num_workers"]
            loader_bound = name == "num_workers" and (best.data_wait_frac() or 0.0) >= LOADER_BOUND
            if s.beats(best, result, LOADER_DUEL_FROM if loader_bound or i == 0 else DUEL_FROM):
                best, stale, dueled_stale = result, 0, 0
            else:
                stale += 1
                dueled_stale += compare.dueled(s.ledger, best, result)
            step_gain = compare.gain(s.ledger, previous, result)[0]  # after beats(): from its lockstep duel if any
            flat = result if best is not result and value > current.settings[name] else None
            if self._plateau(name, best, step_gain, stale, dueled_stale, values[i + 1:]):
                where = "the throughput plateau" if value > current.settings[name] else "where fewer stopped gaining"
                s.ledger.unexplored.extend(f"{name}={v}: past {where}" for v in values[i + 1:])
                break
            if name == "num_workers" and (best.data_wait_frac() or 0.0) < MIN_DATA_WAIT:
                break  # nothing left to wait for
            untold = self._untold_workers(best) if name == "num_workers" and values[i + 1:] else None
            if untold:
                s.ledger.unexplored.extend(f"{name}={v}: {untold}" for v in values[i + 1:])
                self.decisions.append(f"num_workers ladder stops: {untold}")
                break
            previous, previous_gain = result, step_gain
        if name == "batch_size" and flat is not None and self._loading_need(flat) is None:
            # the ladder ended on a rung up that did not pay, and what its loading needs cannot be told
            best = self._batch_with_more_workers(flat, best, steps)
        if steps:
            self.decisions.append(f"{name} ladder: {' -> '.join(steps)}")
        return best

    def _rung_fits(self, name: str, settings: dict[str, Any], previous: ProbeResult, rest: list,
                   still_gaining: bool, previous_gain: float | None) -> bool:
        """Whether the ladder's next rung (`settings`, `rest[0]`) is worth a probe: not where the measured peaks
        put it over the memory budget (the frontier, then), nor past the time budget (`rest` unexplored)."""
        value = rest[0]
        predicted = self._predicted_over_budget(settings) if name == "batch_size" else None
        if predicted:
            self._set_frontier(previous, value, predicted, still_gaining, previous_gain)
            self.notes.append(f"batch_size ladder stopped before batch_size={value}: {predicted}")
            return False
        if not self.session.budget.affordable(extra_s=self._ladder_extra_s(name, previous, value)):
            self.session.ledger.unexplored.extend(f"{name}={v}: over budget" for v in rest)
            return False
        return True

    def _plateau(self, name: str, best: ProbeResult, step_gain: float, stale: int, dueled_stale: int,
                 rest: list) -> bool:
        """Whether a ladder ends at this rung: a step whose median gain over the previous step (`step_gain`) is
        below MIN_GAIN, if it lost clearly (under DUEL_FROM) or the step before did not beat the best either
        (`stale`: rungs in a row that did not); for loader workers while the best probe still waits for data most
        of the step, two steps in a row that do not beat the best (see LOADER_BOUND). `rest`: the rungs after it."""
        if name == "num_workers" and (best.data_wait_frac() or 0.0) >= LOADER_BOUND:
            # still loader-bound: one dip is not the end, nor are screens alone (see LOADER_BOUND), nor a rung
            # still climbing from the one before (one augment_cpu run: 1 worker 0.62x of none, 2 workers 1.25x
            # of 1 but not beyond the noise over none in three duels in turn, and the ladder ended there, where
            # the grid put 2 workers 1.18x over none and 3 workers 1.09x)
            return step_gain < 1 + MIN_GAIN and stale >= 2 and (dueled_stale >= 1 or stale >= SCREENED_STALE)
        # a flat step ends the ladder if it lost clearly, or the rung before did not win either: one flat step can
        # be a dip (lstm_collate's batch of 64 measured 0.96x of 32, and 128 and 256 paid)
        stop = step_gain < 1 + MIN_GAIN and (stale >= 2 or step_gain < DUEL_FROM)
        # ... and two can be: one lstm_collate run read 32 1.01x and 64 1.03x, stopped, and ended at 32 s of its
        # 180 (its twin: 32 1.24x, 128 and 256 paying). While the budget could still walk the rest of the ladder,
        # a plateau of two flat rungs earns one more.
        if stop and stale == 2 and step_gain >= DUEL_FROM and rest and self.session.budget.affordable(
                probes=2 * len(rest)):
            return False
        return stop

    def _loading_need(self, rung: ProbeResult) -> int | None:
        """The loader workers a batch rung needs to keep its compute fed (knobs.workers_the_loading_needs), from
        the baseline's loading time per sample and the rung's compute (its step less its data wait). None where it
        cannot be told: the loading time is not known, the rung loads in its training process (the worker ladder
        weighs that), or it hardly waited."""
        if (self.load_s is None or "num_workers" not in self.knobs or rung.settings["num_workers"] == 0
                or (rung.data_wait_frac() or 0.0) < MIN_DATA_WAIT):
            return None
        return knobs.workers_the_loading_needs(rung.settings["batch_size"], self.load_s, self._compute_s(rung))

    @staticmethod
    def _compute_s(rung: ProbeResult) -> float:
        """A measured step's mean seconds outside waiting for data."""
        return (sum(rung.step_s) - sum(rung.raw.get("data_wait_s") or [])) / len(rung.step_s)

    def _fed(self, rung: ProbeResult, best: ProbeResult, steps: list[str]) -> ProbeResult:
        """`rung` (a batch rung), or the same batch with the loader workers its loading needs when its own fell
        behind: a larger batch asks more of the loader while its compute per sample falls, so the worker count kept
        at the smaller batch can cap it, and the rung would read flat for the loader's sake (hf_trainer: 1 worker
        kept up at batch 8; batch 16 at 1 worker read 1.0x of it in three duels, 78 s of a 180 s budget, and the
        grid's best, batch 32 with 2 workers, was never reached)."""
        need = self._loading_need(rung)
        if need is None or need <= rung.settings["num_workers"]:
            return rung
        ups = self._worker_ups(rung)
        if not ups:
            return rung
        workers = next((v for v in ups if v >= need), ups[-1])
        if not self.session.budget.affordable(extra_s=self._ladder_extra_s("num_workers", rung, workers)):
            return rung
        batch, have = rung.settings["batch_size"], rung.settings["num_workers"]
        self.decisions.append(
            f"batch_size={batch} waited for its {have} loader worker{'s' if have > 1 else ''} "
            f"{rung.data_wait_frac():.0%} of the step: loading {batch} samples takes about "
            f"{batch * self.load_s * 1e3:.0f} ms (the baseline's {self.load_s * 1e3:.2f} ms a sample) against "
            f"{self._compute_s(rung) * 1e3:.0f} ms of compute, so it is judged with num_workers={workers}")
        joint = self.session.measure({**rung.settings, "num_workers": workers}, "ladder:batch_size", best)
        steps.append(f"{batch} with num_workers={workers} ({joint.status.value})")
        return joint if self._usable(joint) else rung

    def _batch_with_more_workers(self, rung: ProbeResult, best: ProbeResult, steps: list[str]) -> ProbeResult:
        """The batch rung that ended its ladder without paying, once more with the next worker count up, if it
        waited for data: a larger batch asks more of the loader, so a worker count that kept up at the start's
        batch may cap the larger one, and each knob alone then looks flat (hf_trainer: 1 worker kept up at batch 8;
        batch 16 and 32 read 1.0x of it at 1 worker; batch 32 with 2 workers, the grid's best, measured 1.27x).
        Returns the best: that probe where it beats `best`, else `best`; the ladder's `steps` gain it where measured."""
        if "num_workers" not in self.knobs or (rung.data_wait_frac() or 0.0) < MIN_DATA_WAIT:
            return best
        ups = self._worker_ups(rung)
        if not ups or not self.session.budget.affordable(extra_s=self._ladder_extra_s("num_workers", rung, ups[0])):
            return best
        joint = self.session.measure({**rung.settings, "num_workers": ups[0]}, "ladder:batch_size", best)
        won = self._usable(joint) and self.session.beats(best, joint)
        steps.append(f"{rung.settings['batch_size']} with num_workers={ups[0]} ({joint.status.value})")
        return joint if won else best

    def _ladder_extra_s(self, name: str, previous: ProbeResult, value) -> float:
        """What the next loader-ladder probe likely costs beyond a typical probe: its warm-up and its step cap grow
        with the worker count (they are counted in waves), so from the previous rung's wall time, scaled."""
        if name != "num_workers" or previous.wall_s <= 0:
            return 0.0
        scale = max(1.0, value / max(1, previous.settings["num_workers"]))
        return max(0.0, previous.wall_s * scale - self.session.budget.typical_probe_s())

    def bisect(self, best: ProbeResult) -> ProbeResult:
        """Narrow the gap between the largest batch that fit and the smallest that did not."""
        f = self.frontier
        while f["smallest_failed"] - f["largest_ok"] > max(BISECT_RESOLUTION, f["largest_ok"] // 8):
            lo, hi = f["largest_ok"], f["smallest_failed"]
            mid = lo + (hi - lo) // 2
            rounded = mid - mid % BISECT_RESOLUTION  # round batch sizes people would pick
            mid = rounded if rounded > lo else mid
            if not self.session.budget.affordable():
                self.session.ledger.unexplored.append(f"batch_size between {lo} and {hi}: over budget")
                break
            settings = {**best.settings, "batch_size": mid}
            predicted = self._predicted_over_budget(settings)
            result = None if predicted else self.session.measure(settings, "bisect:batch_size", best)
            if result is not None and self._usable(result):
                f["largest_ok"] = mid
                if self.session.beats(best, result):
                    best = result
            else:
                f["smallest_failed"] = mid
                f["cause"] = predicted or self._failure(result)
        self.decisions.append(f"batch_size frontier: {f['largest_ok']} fits, {f['smallest_failed']} does not "
                              f"({f['cause']})")
        return best

    def checkpointing(self, current: ProbeResult) -> ProbeResult:
        """Checkpointing at twice the largest batch that fit without it; if kept, the re-opened batch ladder goes on
        from there."""
        settings = {**current.settings, "checkpointing": True, "batch_size": 2 * self.frontier["largest_ok"]}
        result = self.session.measure(settings, "knob:checkpointing", current)
        return result if self._usable(result) and self.session.beats(current, result) else current

    # --- memory ---------------------------------------------------------------------------------------------------

    def outcome(self, base: ProbeResult, recommended: ProbeResult, speedup: dict[str, Any] | None) -> Outcome:
        """The Outcome, its notes saying whether the memory judged covers the dataset's longest item."""
        note = self._coverage_note(recommended)
        if note:
            self.notes.append(note)
        return super().outcome(base, recommended, speedup)

    def _coverage_note(self, recommended: ProbeResult) -> str | None:
        """Where the memory is judged against a capacity and the recommended batches varied in size: whether the
        judgement covers the dataset's longest item, and how far it is known (`probe.evidence.longest_item`)."""
        if not self.ctx.memory_capacity_bytes or recommended.extra.get("input_shapes_static") is not False:
            return None
        longest = (self.ctx.workload.extra or {}).get("longest_item")
        if not longest:
            return ("the batches' input sizes varied and the dataset's longest item is not known (no length, or "
                    "items without a size): the memory left free covers only the batches measured")
        seen, size = recommended.extra.get("largest_input") or 0, longest["size"]
        read = ("" if longest["scanned"] >= longest["items"] else
                f" (the longest of {longest['scanned']:,} of its {longest['items']:,} items, read at random)")
        if not seen:  # a framework's own loop, or a batch without a tensor: no input size recorded
            return (f"the dataset's longest item has {size:,} elements{read}, and the batches measured recorded no "
                    "input size: the memory left free covers only the batches measured")
        if seen >= size:
            return f"the memory judged covers the dataset's longest item, {size:,} elements{read}: its batches held it"
        return (f"the batches measured held inputs of at most {seen:,} elements a sample, the dataset's longest "
                f"item {size:,}{read}: the peaks were scaled to it in proportion (an upper-ish guess for "
                "activations)")

    def _usable(self, result: ProbeResult) -> bool:
        """Finished, within the memory budget and leaving --memory-margin free (`_over_memory`: a run past either
        is not recommendable), its loss unchanged (`changes_loss`) and its compile time repaid within the stated run
        (`compile_unpaid`)."""
        return (result.ok and self._over_memory(result) is None and not self.changes_loss(result)
                and not self.compile_unpaid(result))

    def _judged_peak(self, result: ProbeResult) -> tuple[float, str]:
        """(the peak that decides whether `result`'s batch fits, how it was carried to the dataset's longest item
        as ' (...)' or ''): `cuda_memory.judged_peak`, on a GPU the allocator's reserved peak."""
        longest = (self.ctx.workload.extra or {}).get("longest_item")
        peak, scaled = cuda_memory.judged_peak(result.peak_memory_bytes, result.memory, result.extra, longest)
        return peak, f" ({scaled})" if scaled else ""

    def _over_memory(self, result: ProbeResult) -> str | None:
        """Why `result`'s settings are not recommendable for their memory (its judged peak over the memory budget,
        or inside the margin: `_inside_margin`); None where they fit."""
        budget = self.ctx.memory_budget_bytes
        peak, how = self._judged_peak(result)
        if budget and peak > budget:
            return f"peak memory {peak / 2**30:.2f} GiB{how} is over the memory budget of {budget / 2**30:.2f} GiB"
        return self._inside_margin(result)

    def _inside_margin(self, result: ProbeResult) -> str | None:
        """Why `result`'s peak leaves less than --memory-margin of the capacity free (a run that close to the limit
        fails later, on a longer input, in evaluation or after fragmentation); None where it leaves enough, or
        where no capacity is known (a CPU without --max-memory)."""
        capacity, margin = self.ctx.memory_capacity_bytes, self.ctx.memory_margin_bytes
        peak, how = self._judged_peak(result)
        if not (capacity and margin) or peak <= capacity - margin:
            return None
        if peak > capacity:
            return f"peaked at {fmt_bytes(int(peak), 1)}{how}, over the {fmt_bytes(capacity, 1)} of memory"
        return (f"peaked at {fmt_bytes(int(peak), 1)}{how} of {fmt_bytes(capacity, 1)}, inside the "
                f"{self._margin_text()} margin")

    def _margin_text(self) -> str:
        """The margin: its share of the capacity and its size."""
        capacity, margin = self.ctx.memory_capacity_bytes, self.ctx.memory_margin_bytes
        return f"{margin / capacity:.0%} ({fmt_bytes(margin, 1)})"

    def _failure(self, result: ProbeResult) -> str:
        if result.ok:
            return self._over_memory(result) or self.changes_loss(result) or "not recommendable"
        status = result.status.value
        if result.error and result.error.startswith(f"{status}:"):  # a budget stop's error says "stopped: ..."
            return result.error
        return status + (f": {result.error}" if result.error else "")

    def _set_frontier(self, last_ok: ProbeResult, failed_batch: int, cause: str, still_gaining: bool,
                      last_step_gain: float | None) -> None:
        self.frontier = {
            "largest_ok": last_ok.settings["batch_size"], "smallest_failed": failed_batch, "cause": cause,
            "still_gaining": still_gaining,
            # unknown when the first step up already failed: then only a probe can tell
            "last_step_gain": last_step_gain if last_step_gain is not None else 1 + MIN_GAIN,
            "settings": without(last_ok.settings, "batch_size"),
        }

    def _predicted_over_budget(self, settings: dict[str, Any]) -> str | None:
        """Why this batch would not fit, when a straight line through the measured peaks (same settings, other batch
        sizes; on a GPU the allocator's reserved peaks) puts it over the memory budget, or inside --memory-margin:
        then it is not run."""
        ctx = self.ctx
        budget, capacity, margin = ctx.memory_budget_bytes, ctx.memory_capacity_bytes, ctx.memory_margin_bytes
        limited = budget or (capacity and margin)
        predicted = pairing.extrapolated_peak(self.session.ledger.probes, settings) if limited else None
        if predicted is None:
            return None
        if budget and predicted > budget:
            return (f"predicted peak memory {predicted / 2**30:.2f} GiB is over the memory budget of "
                    f"{budget / 2**30:.2f} GiB")
        if capacity and margin and predicted > capacity:
            return (f"predicted peak memory {fmt_bytes(int(predicted), 1)} is over the {fmt_bytes(capacity, 1)} "
                    "of memory")
        if capacity and margin and predicted > capacity - margin:
            return (f"predicted peak memory {fmt_bytes(int(predicted), 1)} of {fmt_bytes(capacity, 1)} is inside "
                    f"the {self._margin_text()} margin")
        return None

