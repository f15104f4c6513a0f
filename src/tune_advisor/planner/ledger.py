"""The probe ledger: every probe of a plan, numbered, and what was measured for each setting.

It numbers probes (p001, ...), hands back the earlier probe of the same settings (reuse), replays an interrupted
run's finished probes (resume), and keeps what the comparisons (planner/compare.py) read: the duels, the lockstep
wins a chain of them rests on, the gain each kept knob was kept on, the plan's baseline and its best so far. It runs
nothing: the Session (planner/session.py) has probes run and records them here.
"""

from __future__ import annotations

import math
from types import MappingProxyType
from typing import Any, Callable, Mapping

from .. import knobs
from ..probe.result import ProbeResult
from . import figures
from .compare import Gain
from .ratios import settings_key

Duel = tuple[ProbeResult, ProbeResult]  # (reference side, candidate side)


class Unexplored(list):
    """What the plan left unexplored, each entry once: a re-opened ladder stops at the same plateau again."""

    def append(self, entry: str) -> None:
        if entry not in self:
            super().append(entry)

    def extend(self, entries) -> None:
        for entry in entries:
            self.append(entry)


class ProbeLedger:
    """Every probe of the plan in run order (`probes`), and what it established.

    `finished` resumes an interrupted run: its probes as (result, session elapsed seconds when it was recorded), in
    run order. The planner is deterministic given its probe results, so it asks for the same probes again, and each
    is handed back (`replayed`) instead of run, with the budget's clock standing at `replay_at`, the time it was
    recorded then, so budget decisions come out as they did. The first request that differs (e.g. a smaller budget
    now) ends the replay: the rest are `discarded` and the plan goes on live. `carried_s` is the interrupted run's
    time up to its last finished probe. `on_probe` hears of every probe recorded.
    """

    def __init__(self, finished: list[tuple[ProbeResult, float]] | None = None,
                 on_probe: Callable[[ProbeResult], None] | None = None):
        self.on_probe = on_probe
        self._replay = list(finished or [])
        self.carried_s = self._replay[-1][1] if self._replay else 0.0
        first = self._replay[0] if self._replay else None
        self.replay_at = max(0.0, first[1] - first[0].wall_s) if first else 0.0
        self.probes: list[ProbeResult] = []
        self.reused: list[ProbeResult] = []
        self.discarded: list[ProbeResult] = []
        self.unexplored: list[str] = Unexplored()
        self._first: dict[tuple, ProbeResult] = {}  # settings -> the probe that answers for them (reuse)
        self._duels: dict[tuple, list[Duel]] = {}  # (reference, candidate) settings keys -> their duels
        # candidate key -> (reference key, gain) of each change kept in a lockstep duel (compare.chained_gain)
        self._wins: dict[tuple, dict[tuple, Gain]] = {}
        self._keeps: dict[str, dict[str, Any]] = {}  # knob -> the search's keep of it (note_keep)
        self._baseline: ProbeResult | None = None
        self._best: ProbeResult | None = None
        # Whether the strategy keeps a best as it goes (adaptive), so that while it has kept none there is nothing to
        # confirm; the grid keeps none until its end, and its fastest probe so far stands for one (Budget)
        self.keeps_as_it_goes = False
        self.on_best: Callable[[ProbeResult], None] | None = None  # hears of each best kept (analyze saves it)

    # --- numbering and reuse --------------------------------------------------------------------------------------

    def next_id(self, ahead: int = 0) -> str:
        """The id of the next probe recorded (`ahead`: of the one that many after it)."""
        return f"p{len(self.probes) + 1 + ahead:03d}"

    def seen(self, settings: dict[str, Any]) -> ProbeResult | None:
        """The probe that answers for `settings`: the first of them, unless one replaced it (`remember`)."""
        return self._first.get(settings_key(settings))

    def remember(self, result: ProbeResult, replace: bool = False) -> ProbeResult:
        """Make `result` answer for its settings if none does yet (`replace`: even if one does)."""
        key = settings_key(result.settings)
        if replace or key not in self._first:
            self._first[key] = result
        return self._first[key]

    # --- a resumed run --------------------------------------------------------------------------------------------

    @property
    def replaying(self) -> bool:
        """Whether finished probes of the interrupted run are still waiting to be asked for again."""
        return bool(self._replay)

    def end_replay(self) -> None:
        """The plan is over, or left the interrupted run's path: its probes not asked for again are discarded."""
        self.discarded += [result for result, _ in self._replay]
        self._replay = []

    def replayed(self, settings: dict[str, Any], role: str) -> ProbeResult | None:
        """The next finished probe if it is the one now asked for; else the replay ends here."""
        if not self._replay:
            return None
        result, elapsed = self._replay[0]
        if result.settings != settings or result.role != role:
            self.end_replay()
            return None
        self._replay.pop(0)
        self.replay_at = elapsed
        self.reused.append(result)
        return result

    # --- recording ------------------------------------------------------------------------------------------------

    def record(self, result: ProbeResult, role: str = "") -> ProbeResult:
        """Add a finished probe (its `role` where it has none); one the budget stopped before any window of its
        settings was measured leaves them unexplored."""
        result.role = result.role or role
        if result.extra.get("budget_stopped") and not self.runs(result.settings):  # measured already: explored
            where = knobs.describe(result.settings, self._baseline.settings) if self._baseline else "the baseline"
            self.unexplored.append(f"{where}: stopped when the budget ran out ({result.id})")
        self.probes.append(result)
        if self.on_probe:
            self.on_probe(result)
        return result

    def note_duel(self, reference: dict[str, Any], candidate: dict[str, Any], duel: Duel) -> None:
        """Two settings measured again, side by side or in turn: `duel` holds their (reference, candidate) probes."""
        self._duels.setdefault((settings_key(reference), settings_key(candidate)), []).append(duel)

    def note_win(self, reference: ProbeResult, candidate: ProbeResult, gain: Gain) -> None:
        """`candidate` was kept over `reference` on lockstep duels measuring `gain`: a link of a chain of wins. A
        setting can win over several (a ladder's rung over the one below it, then an ablation's pair over itself
        without a knob): each is a link, none replaces another (a 1-minute lstm_collate run's ablation of amp
        replaced its batch ladder's last link, and its batch 256 was then judged from two probes 25 s apart, 1.03x,
        and dropped, where its chain of lockstep wins read 1.26x [1.22, 1.30])."""
        self._wins.setdefault(settings_key(candidate.settings), {})[settings_key(reference.settings)] = gain

    def note_keep(self, reference: ProbeResult, candidate: ProbeResult, gain: Gain | None) -> None:
        """Remember, for each knob `candidate` changed, the `gain` on which the search kept it over `reference`: an
        ablation with no time left and no probe without the knob quotes it (planner/ablation.py), so that the rules
        state the figure the recommendation rests on, not one of their own from separate probes."""
        change = knobs.describe(candidate.settings, reference.settings)
        for name, value in candidate.settings.items():
            if reference.settings.get(name) != value:
                self._keeps[name] = {"value": value, "gain": gain, "change": change, "beside": reference.settings,
                                     "settings": candidate.settings, "probes": [reference.id, candidate.id]}

    def kept_gain(self, best: ProbeResult) -> float | None:
        """`best`'s gain over the baseline as the search kept it: the product of the keeps (`note_keep`) whose
        changes it holds, each once; None without one."""
        keeps = {(k["change"], tuple(k["probes"])): k["gain"] for name, k in self._keeps.items()
                 if best.settings.get(name) == k["value"] and k["gain"] is not None}
        return math.prod(g[0] for g in keeps.values()) if keeps else None

    def start_from(self, baseline: ProbeResult) -> None:
        """The plan's baseline probe: every gain is reckoned from it."""
        self._baseline = baseline

    def keep_best(self, best: ProbeResult) -> None:
        """The best settings so far: the confirmation's cost is reckoned between them and the baseline."""
        self._best = best
        if self.on_best:
            self.on_best(best)

    # --- reading --------------------------------------------------------------------------------------------------

    @property
    def baseline(self) -> ProbeResult | None:
        return self._baseline

    @property
    def best(self) -> ProbeResult | None:
        return self._best

    def is_baseline(self, probe: ProbeResult) -> bool:
        """Whether `probe` measured the baseline's settings (the plan's start)."""
        return self._baseline is not None and probe.settings == self._baseline.settings

    @property
    def duels(self) -> Mapping[tuple, list[Duel]]:
        """Every duel by its (reference, candidate) settings keys, in the order the pairs were first dueled."""
        return MappingProxyType(self._duels)

    @property
    def wins(self) -> Mapping[tuple, Mapping[tuple, Gain]]:
        """candidate key -> {reference key: gain} of each change kept in lockstep duels."""
        return MappingProxyType(self._wins)

    @property
    def keeps(self) -> Mapping[str, dict[str, Any]]:
        """knob -> the search's keep of it (`note_keep`)."""
        return MappingProxyType(self._keeps)

    def runs(self, settings: dict[str, Any], paired: bool | None = None) -> list[ProbeResult]:
        """The finished probes of these settings with a measured window, of one kind (`figures.runs`)."""
        return figures.runs(self.probes, settings, paired)

    def samples(self, settings: dict[str, Any], paired: bool = False) -> tuple[list[float], list[float]]:
        """Items and step times of every finished probe of these settings of one kind, pooled: re-checks add
        evidence."""
        runs = self.runs(settings, paired)
        return [x for p in runs for x in p.items], [x for p in runs for x in p.step_s]
