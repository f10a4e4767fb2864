"""One problem's search loop: sample from the policy, evaluate, learn, update the elite.

Shared by the solver (one problem, one evaluator) and by pretraining (many problems,
one policy). Nothing here reads the budget: the loop runs until the evaluator raises
:class:`~shardlab.solvers.evaluator.BudgetExhausted` (or the user presses Ctrl-C),
so the best plan after ``n`` evaluations does not depend on the budget.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from shardlab.problems.problem import Problem
from shardlab.solvers.evaluator import INFEASIBLE, Evaluator
from shardlab.solvers.recipe import recipe_plans
from shardlab.solvers.rl.config import RLConfig
from shardlab.solvers.rl.decisions import Decisions
from shardlab.solvers.rl.edit import EditPolicy, EditRollout
from shardlab.solvers.rl.features import class_edges, decision_classes
from shardlab.solvers.rl.policy import Elite, Policy, ProblemTensors, Rollout
from shardlab.solvers.rl.reward import megatron_codes, rank_rewards, rewards

AnyPolicy = Policy | EditPolicy


def build_policy(config: RLConfig) -> AnyPolicy:
    """The network ``config.proposal`` names, with the torch RNG as it stands."""
    return EditPolicy(config) if config.proposal == "edit" else Policy(config)


def new_policy(config: RLConfig, seed: int) -> AnyPolicy:
    """A freshly initialized policy whose weights depend only on ``seed``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_policy(config)


class Search:
    def __init__(
        self,
        problem: Problem,
        evaluator: Evaluator,
        policy: AnyPolicy,
        optimizer: torch.optim.Optimizer,
        config: RLConfig,
        gen: torch.Generator,
    ) -> None:
        self.problem = problem
        self.ev = evaluator
        self.policy = policy
        self.opt = optimizer
        self.config = config
        self.gen = gen
        self.dec = Decisions(problem.space)
        self.pt = ProblemTensors.build(problem, self.dec)
        self.codes = np.zeros((0, problem.space.n_vars), dtype=np.int64)  # distinct plans seen
        self.fit = np.zeros(0)
        self._seen: set[bytes] = set()
        self.megatron_ref: float | None = None
        self.temperature = 1.0
        self.baseline: float | None = None  # REINFORCE
        self.iterations = 0
        self._probed: set[int] = set()  # degree tuples whose neighbours were probed
        # polish's two neighbourhoods: each class alone, then the two classes of each edge
        n_classes = int(decision_classes(self.dec).max(initial=-1)) + 1
        self._move_sets = ([(c,) for c in range(n_classes)], class_edges(self.dec))
        self._polished: set[tuple[bytes, bool]] = set()  # (best plan, edges) evaluated
        self._stalled = 0  # iterations since the best plan last improved
        self._best = -np.inf

    # -- bookkeeping -------------------------------------------------------------------

    def _record(self, codes: np.ndarray, fit: np.ndarray) -> None:
        keep = []
        for i, row in enumerate(codes):
            key = row.tobytes()
            if key not in self._seen:
                self._seen.add(key)
                keep.append(i)
        if keep:
            self.codes = np.concatenate([self.codes, codes[keep]])
            self.fit = np.concatenate([self.fit, fit[keep]])

    def _repeats(self, codes: np.ndarray) -> np.ndarray:
        """Rows evaluated before, or repeating an earlier row of the batch."""
        seen = set(self._seen)
        out = np.zeros(len(codes), dtype=bool)
        for i, row in enumerate(codes):
            key = row.tobytes()
            out[i] = key in seen
            seen.add(key)
        return out

    @property
    def reference(self) -> float | None:
        """Megatron's objective, else the best feasible objective so far (None: none yet)."""
        if self.megatron_ref is not None:
            return self.megatron_ref
        feasible = self.fit[self.fit > INFEASIBLE]
        return float(feasible.max()) if len(feasible) else None

    def elite(self, order: np.ndarray) -> Elite:
        """The elite history (rows ``order``, from :meth:`_elite_rows`) as the policy
        reads it."""
        # the best plan seen on each degree tuple (the codes' first variable)
        by_fit = np.argsort(-self.fit, kind="stable")
        tuples, first = np.unique(self.codes[by_fit, 0], return_index=True)
        return Elite(
            actions=self.dec.to_actions(self.codes[order]),
            rewards=rewards(self.fit[order], self.reference, self.config),
            tuples=tuples,
            bests=self.dec.to_actions(self.codes[by_fit[first]]),
            best_fit=self.fit[by_fit[first]],
        )

    def _elite_rows(self) -> np.ndarray:
        """Rows of the elite history, best first."""
        k, cap = self.config.elite_size, self.config.elite_per_degrees
        order = np.argsort(-self.fit, kind="stable")
        if cap > 0:  # keep several degree tuples in view, not K variants of one
            counts: dict[int, int] = {}
            keep = []
            for i in order:
                d = int(self.codes[i, 0])
                if counts.get(d, 0) < cap:
                    counts[d] = counts.get(d, 0) + 1
                    keep.append(i)
                    if len(keep) == k:
                        break
            order = np.array(keep, dtype=np.int64)
        return order[:k]

    # -- the loop ----------------------------------------------------------------------

    def start(self) -> None:
        """Price the Megatron plans in the order the megatron rule does (the reference),
        then (``start_recipes``) the engine's recipe plans: the first members of the
        elite history."""
        for row in megatron_codes(self.problem):
            m = self.ev.metrics(row[None])
            self._record(row[None], self.ev.evaluate(row[None]))
            if not m.memory_violation[0]:
                self.megatron_ref = float(m.objective[0]) if m.feasible[0] else None
                break
        if self.config.start_recipes:
            space = self.problem.space
            plans = recipe_plans(self.problem)
            if plans:
                codes = np.array([space.encode(p) for p in plans], dtype=np.int64)
                if self.config.retune and isinstance(self.policy, EditPolicy):
                    # and each retuned: its options re-chosen by the cost tables, as a
                    # proposal's on a new tuple (a recipe's options are one-size)
                    codes = np.concatenate([codes, self._retuned(codes)])
                self._add(codes)
        self._probe()

    def _retuned(self, codes: np.ndarray) -> np.ndarray:
        """``codes`` with their options re-chosen for their tuples by the cost tables."""
        acts = self.dec.to_actions(codes)
        return self.dec.to_codes(self.pt.costs.fastest(codes[:, 0], acts, self.config.retune))

    def _add(self, codes: np.ndarray) -> None:
        """Evaluate and record the plans of ``codes`` not seen before."""
        codes = codes[~self._repeats(codes)]
        if len(codes):
            self._record(codes, self.ev.evaluate(codes))

    def _neighbours(self, d: int) -> list[int]:
        """The degree tuples one step from tuple ``d``: pp or tp doubled or halved with
        attention DP the other way (the GPUs of an attention replica kept), EP doubled
        or halved; those that exist in the space."""
        names = self.problem.space.axes
        moves: list[dict[str, float]] = []
        if "dp_attn" in names:
            moves += [{a: f, "dp_attn": 1 / f} for a in ("pp", "tp") for f in (2, 0.5)]
        if "ep" in names:
            moves += [{"ep": 2}, {"ep": 0.5}]
        rows = np.repeat(self.dec.tuple_values[d][None].astype(float), len(moves), axis=0)
        for row, move in zip(rows, moves, strict=True):
            for a, f in move.items():
                row[names.index(a)] *= f
        return [int(j) for j in self.dec.tuple_index(rows) if j not in (-1, d)]

    def _probe(self) -> None:
        """``probe``: the best plan retuned on each neighbour of its tuple, once per tuple."""
        cfg = self.config
        if not (cfg.probe and cfg.retune and isinstance(self.policy, EditPolicy)):
            return
        if not len(self.fit) or self.fit.max() <= INFEASIBLE:
            return
        best = self.codes[int(np.argmax(self.fit))]
        d = int(best[0])
        if d in self._probed:
            return
        self._probed.add(d)
        near = self._neighbours(d)
        if not near:
            return
        codes = np.repeat(best[None], len(near), axis=0)
        codes[:, 0] = near
        self._add(self._retuned(self.problem.space.repair(codes)))

    def _polish(self) -> None:
        """``polish``: after that many iterations without a better plan, the best plan's
        class moves (:meth:`EditPolicy.class_moves`), then (none better) its edges'
        pairs of moves; from each better plan found, again, until none is better."""
        cfg = self.config
        if not (cfg.polish and isinstance(self.policy, EditPolicy)):
            return
        top = self.fit.max(initial=-np.inf)
        self._stalled = 0 if top > self._best else self._stalled + 1
        self._best = top
        while self._stalled >= cfg.polish and top > INFEASIBLE:
            best = self.codes[int(np.argmax(self.fit))]
            edges = (best.tobytes(), False) in self._polished
            if (best.tobytes(), edges) in self._polished:
                return
            self._polished.add((best.tobytes(), edges))
            self._add(self.policy.class_moves(self.pt, best, self._move_sets[edges]))
            top = self.fit.max()
            if top > self._best:
                self._best = top
                self._probe()  # a better plan may stand on a new tuple

    def step(self) -> None:
        """One iteration: sample a batch, evaluate it, learn from it."""
        cfg = self.config
        self.ev.check_time()  # sampling long plans takes a good part of a second too
        rows = self._elite_rows()
        elite_fit, elite = self.fit[rows], self.elite(rows)
        with torch.no_grad():  # one reading of the elite for the batch and its redraws
            reading = self.policy.read(self.pt, elite)
        draw = self.policy.sample
        roll = draw(self.pt, elite, cfg.batch_size, self.gen, self.temperature, reading)
        codes = self.dec.to_codes(roll.actions.numpy())
        repeat = self._repeats(codes)
        for _ in range(cfg.redraws):  # repeats teach the policy to flee the elite
            if not repeat.any():
                break
            again = torch.from_numpy(np.flatnonzero(repeat))
            redrawn = draw(self.pt, elite, len(again), self.gen, self.temperature, reading)
            for f in dataclasses.fields(roll):  # every field is per row
                getattr(roll, f.name)[again] = getattr(redrawn, f.name)
            codes = self.dec.to_codes(roll.actions.numpy())
            repeat = self._repeats(codes)
        before, best = self.ev.n_evals, self.fit.max(initial=-np.inf)
        fit = self.ev.evaluate(codes)
        self._record(codes, fit)
        if cfg.reheat_on == "stall":
            progressed = bool(fit.max(initial=-np.inf) > best)
        else:
            progressed = self.ev.n_evals > before
        if progressed:
            self.temperature = 1.0
        else:  # explore more widely; further when nothing proposed was new
            new = self.ev.n_evals > before
            ceiling = (
                cfg.max_temperature if new else max(cfg.max_temperature, cfg.repeat_temperature)
            )
            self.temperature = min(self.temperature * cfg.reheat, ceiling)
        if cfg.reward in ("rank", "parent"):
            r = rank_rewards(fit, elite_fit, cfg)
            if cfg.reward == "parent" and isinstance(roll, EditRollout) and len(elite_fit):
                # a rebased child's parent is the best plan of its tuple
                at = np.minimum(np.searchsorted(elite.tuples, codes[:, 0]), len(elite.tuples) - 1)
                parent = np.where(
                    roll.rebased.numpy(), elite.best_fit[at], elite_fit[roll.parents.numpy()]
                )
                better = (fit > parent) + 0.5 * (fit == parent)
                r = np.where(fit > INFEASIBLE, 0.5 * (r + better), r)
        else:
            r = rewards(fit, self.reference, cfg)
        r = r - cfg.repeat_penalty * repeat
        self.learn(elite, roll, r)
        self.iterations += 1
        self._probe()
        self._polish()

    def run(self) -> None:
        """Search until the evaluator stops it (BudgetExhausted) or Ctrl-C."""
        if self.iterations == 0 and not len(self.codes):
            self.start()
        while True:
            self.step()

    # -- learning ------------------------------------------------------------------------

    def learn(self, elite: Elite, roll: Rollout | EditRollout, r: np.ndarray) -> None:
        cfg = self.config
        reward = torch.from_numpy(r.astype(np.float32))
        if cfg.algorithm == "ppo":
            base = float(reward.mean())
            epochs = cfg.ppo_epochs
        else:
            mean = float(reward.mean())
            base = mean if self.baseline is None else self.baseline
            self.baseline = cfg.baseline_decay * base + (1 - cfg.baseline_decay) * mean
            epochs = 1
        adv = reward - base if cfg.baseline else reward
        if cfg.normalize:
            std = float(reward.std()) if len(reward) > 1 else 0.0
            adv = adv / std if std > 1e-8 else adv * 0.0
        for _ in range(epochs):
            # an epoch over long plans takes a good part of a second: not past the limit
            self.ev.check_time()
            logp, entropy = self.policy.evaluate(self.pt, elite, roll)
            if cfg.algorithm == "ppo":
                ratio = torch.exp(logp - roll.logp)
                clipped = torch.clamp(ratio, 1 - cfg.clip, 1 + cfg.clip)
                policy_loss = -torch.min(ratio * adv, clipped * adv).mean()
            else:
                policy_loss = -(adv * logp).mean()
            loss = policy_loss - cfg.entropy_coef * entropy.mean()
            self.opt.zero_grad()
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
            if not torch.isfinite(norm):  # one bad batch must not poison the weights
                self.opt.zero_grad()
                continue
            self.opt.step()
