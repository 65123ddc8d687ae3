"""What is written, and when recovery stops: each candidate against PTQ's own model of the mode
and the written model against the original fp32, by paired sequential tests on recovery's
own test seeds."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from quarl.core.errors import QuarlError
from quarl.envs import EnvSpec
from quarl.evaluation.episodes import evaluate
from quarl.policies.base import Policy
from quarl.quant.modes import MODES
from quarl.quant.student import KernelSpec
from quarl.recovery.config import TEST_CAPS, TEST_FIRST, TEST_SEEDS, TEST_STEPS
from quarl.recovery.dagger import RecoveryResult, kernel_policy, ptq_model
from quarl.recovery.report import RecoveryJson, TestOutcome
from quarl.verdict import TOLERANCE, Decision, Sequential, sequential_at_least, sequential_keeps

log = logging.getLogger(__name__)


class TestEpisodes:
    """Per-episode returns on recovery's calibration episodes (:data:`TEST_SEEDS`, episode
    ``i`` reset with seed ``28,000 + i``), played on demand and kept per policy, so the
    original fp32 policy and PTQ's model play each episode once for the whole run."""

    def __init__(self, env_spec: EnvSpec, max_steps: int | None = None) -> None:
        from quarl.evaluation.calibration import CALIBRATION_EPISODE_STEPS

        self.env_spec = env_spec
        self.max_steps = min(max_steps or CALIBRATION_EPISODE_STEPS, CALIBRATION_EPISODE_STEPS)
        self._played: dict[int, tuple[Policy, list[float], list[int]]] = {}

    def __call__(self, policy: Policy, n: int) -> np.ndarray:
        if n > len(TEST_SEEDS):
            raise QuarlError(f"{n} test episodes are more than recovery's {len(TEST_SEEDS)} test seeds")
        _, returns, lengths = self._played.setdefault(id(policy), (policy, [], []))
        if len(returns) < n:
            more = n - len(returns)
            result = evaluate(policy, self.env_spec, episodes=more, seed=TEST_SEEDS.start + len(returns),
                              n_envs=min(more, 32), max_steps=self.max_steps)
            returns.extend(result.returns.tolist())
            lengths.extend(result.lengths.tolist())
        return np.asarray(returns[:n], np.float64)

    def cap(self, policy: Policy) -> int:
        """Episodes a test against ``policy`` may play: :data:`TEST_STEPS` over its mean
        episode length in the first look, within :data:`TEST_CAPS`."""
        self(policy, TEST_FIRST)
        lengths = self._played[id(policy)][2][:TEST_FIRST]
        low, high = TEST_CAPS
        return int(np.clip(TEST_STEPS // max(float(np.mean(lengths)), 1.0), low, min(high, len(TEST_SEEDS))))


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def _outcome(outcome: Sequential, episodes: TestEpisodes, a: Policy, b: Policy, tolerance: float) -> TestOutcome:
    """A sequential test as recovery.json records it (E and its interval in percent; the
    two means over the episodes it played)."""
    v, n = outcome.verdict, outcome.episodes
    label = v.label()
    if outcome.kept and v.verdict != Decision.KEEPS:
        label = "tied (the same return on every episode)"
    elif tolerance == 0:  # the label's own wording is about the 5 % tolerance
        label = label.replace("(E near 5 %)", "(E near 0)")
    relative = v.relative  # E means nothing where fp32's mean cannot be told from 0: none is written
    return {"kept": bool(outcome.kept), "verdict": label, "e": _finite(v.e) if relative else None,
            "low": _finite(v.low) if relative else None, "high": _finite(v.high) if relative else None,
            "episodes": n, "seeds": [TEST_SEEDS.start, TEST_SEEDS.start + n - 1],
            "means": [float(np.mean(episodes(a, n))), float(np.mean(episodes(b, n)))]}


@dataclass
class Candidate:
    """A student one stage of the run made (its weights, its real model) and what the
    paired tests said of it."""

    stage: str
    result: RecoveryResult
    acting: Policy
    against_ptq: TestOutcome


class Judge:
    """The paired sequential tests on :class:`TestEpisodes` that decide what recovery
    writes and when it stops (:func:`quarl.verdict.sequential_at_least`,
    :func:`quarl.verdict.sequential_keeps`):

    - a student is a candidate only where it plays at least as well as PTQ's own model of
      the mode (the confidence sequence shows it scoring more, or both play the same
      returns): a repair never ships what it could not show is no worse than PTQ;
    - of the candidates, the one with the highest mean return on the episodes both played
      is written; else PTQ's own model;
    - recovery stops where what it would write keeps the ORIGINAL fp32 policy's return
      (strict: undecided at the cap is not kept)."""

    def __init__(self, policy: Policy, env_spec: EnvSpec, spec: KernelSpec, max_steps: int | None = None) -> None:
        self.policy, self.env_spec, self.spec = policy, env_spec, spec
        self.episodes = TestEpisodes(env_spec, max_steps)
        self.ptq_model = ptq_model(policy, spec)
        self.ptq = kernel_policy(policy, spec, self.ptq_model)
        self.candidates: list[Candidate] = []
        self._keeps: dict[int, TestOutcome] = {}

    def offer(self, stage: str, result: RecoveryResult) -> TestOutcome:
        """Test ``result``'s student against PTQ's model; a candidate where it is at least
        as good. Returns the test's record (``same`` where the student is PTQ's model).
        ``result`` may run another kernel than PTQ's (the mixed int4/int8 repair, even its
        own PTQ model): the same test decides."""
        if result.model == self.ptq_model or (result.best_round < 0 and result.spec == self.spec):
            return {"kept": False, "verdict": "the student is PTQ's own model", "same": True}
        acting = kernel_policy(self.policy, result.spec, result.model)
        cap = self.episodes.cap(self.ptq)
        outcome = sequential_at_least(lambda n: self.episodes(self.ptq, n), lambda n: self.episodes(acting, n),
                                      first=TEST_FIRST, cap=cap, env_id=self.env_spec.env_id)
        record = _outcome(outcome, self.episodes, self.ptq, acting, 0.0)
        if outcome.kept:
            self.candidates.append(Candidate(stage, result, acting, record))
        log.info("%s against PTQ's own model on %d test episodes: %s (E %s, means %.2f / %.2f): %s", stage,
                 outcome.episodes, outcome.verdict.label(), record["e"], *record["means"],
                 "a candidate" if outcome.kept else "not shown at least as good, not written")
        return record

    def best(self) -> Candidate | None:
        """The candidate written: the highest mean on the episodes every candidate played."""
        if not self.candidates:
            return None
        n = min(c.against_ptq["episodes"] for c in self.candidates)
        return max(reversed(self.candidates), key=lambda c: float(np.mean(self.episodes(c.acting, n))))

    def keeps(self) -> TestOutcome:
        """Does what would be written keep the original fp32 policy's return (strict)?"""
        chosen = self.best()
        acting = self.ptq if chosen is None else chosen.acting
        if id(acting) not in self._keeps:
            cap = self.episodes.cap(self.policy)
            outcome = sequential_keeps(lambda n: self.episodes(self.policy, n), lambda n: self.episodes(acting, n),
                                       first=TEST_FIRST, cap=cap, env_id=self.env_spec.env_id, strict=True)
            self._keeps[id(acting)] = _outcome(outcome, self.episodes, self.policy, acting, TOLERANCE)
        return self._keeps[id(acting)]


def _against_ptq_text(stage: str, test: TestOutcome) -> str:
    """A candidate's test against PTQ's model in words: what each scored and what that showed."""
    if "means" not in test:
        return f"{stage}: {test.get('verdict', '')}"
    ptq, student = test["means"]
    shown = "shown no worse (one-sided 95 %)" if test.get("kept") else "not shown at least as good"
    if str(test.get("verdict", "")).startswith("tied"):
        shown = "the same return on every episode"
    return f"{stage}: the student {student:.2f}, PTQ {ptq:.2f} over {test['episodes']} test episodes, {shown}"


def _against_fp32_text(test: TestOutcome) -> str:
    """The written model's test against the original fp32 policy in words."""
    if "means" not in test:
        return str(test.get("verdict", ""))
    fp32, written = test["means"]
    interval = "" if test.get("low") is None or test.get("high") is None else \
        f" [{test['low']:.1f}, {test['high']:.1f}]"
    e = "" if test.get("e") is None else f", E {test['e']:.1f} %{interval}"
    verdict = str(test.get("verdict", "")).split(" (")[0]
    verb = {"keeps": "keeps", "loses": "loses"}.get(verdict, f"is {verdict} on")
    return (f"{verb} the original fp32's return{e}: {written:.2f} against fp32's {fp32:.2f} over {test['episodes']} "
            "test episodes")


def shipped_line(record: RecoveryJson) -> str:
    """What recovery.json says was written and why the run ended, in one line."""
    mode = record.get("kernel", {}).get("mode", f"int{record.get('precision', '')}")
    if "shipped" not in record or "against_fp32" not in record:
        return f"wrote {'PTQ' if record.get('shipped') == 'ptq' else 'the student'} ({mode})"
    sizes = record.get("sizes")
    size = "" if sizes is None else f", {sizes['shipped']:,} bytes (fp32 {sizes['fp32']:,})"
    if record["shipped"] == "ptq" and not record.get("stages"):
        return (f"wrote PTQ's own {mode} model as it is{size}: it already "
                f"{_against_fp32_text(record['against_fp32'])}; stopped: kept, nothing to repair")
    if record["shipped"] == "ptq":
        tried = [_against_ptq_text(str(s["stage"]), s["against_ptq"]) for s in record.get("stages", [])
                 if not s["against_ptq"].get("same")]
        what = (f"wrote PTQ's own {mode} model{size}, not a student: no student was shown to play at least as well on "
                f"recovery's test episodes ({'; '.join(tried) or 'distillation did not beat PTQ on held-out states'})")
    else:
        stage = str(record["shipped_stage"])
        name = {"distill": "distilled", "finetune": "fine-tuned"}.get(stage, f"distilled ({stage})")
        kernel = f"{mode}, blocks of {record.get('kernel', {}).get('block_size', '?')}{size}"
        grid = MODES[mode].student if mode in MODES else None
        if grid is not None and grid.head_bits is not None:
            kernel = f"mixed int4/int{grid.head_bits} head: {kernel}"
        what = (f"wrote the {name} student ({kernel}): it plays at least as well as PTQ's own "
                f"{record.get('ptq_mode', mode)} model on recovery's test episodes "
                f"({_against_ptq_text(stage, record['against_ptq'])})")
    budget = record.get("budget", {})
    tuned = record.get("finetune", {})
    spent = f"{budget.get('rounds_played', '?')} of {budget.get('rounds', '?')} rounds"
    if tuned:
        spent += ", fine-tune " + (f"{tuned['steps']:,} steps" if "skipped" not in tuned
                                   else f"skipped: {tuned['skipped']}")
    stopped = "kept" if record["stopped"] == "kept" else f"budget spent ({spent}, {record.get('total_s', 0):.0f} s)"
    return f"{what}; stopped: {stopped}: the written model {_against_fp32_text(record['against_fp32'])}"
