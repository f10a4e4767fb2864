"""Every knob of the ``rl`` solver and of its pretraining, in one frozen dataclass."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from shardlab.errors import ShardlabError
from shardlab.solvers.choices import check_choices, hints, read_text

Algorithm = Literal["ppo", "reinforce"]
Proposal = Literal["edit", "decode"]
EliteEncoding = Literal["attention", "mean"]
Reward = Literal["log", "rank", "parent"]
ReheatOn = Literal["repeat", "stall"]
# Knobs that shape the network: a loaded checkpoint keeps its own.
NETWORK_FIELDS: tuple[str, ...] = (
    "proposal",
    "elite_encoding",
    "d_model",
    "n_heads",
    "n_layers",
    "ff_dim",
    "logit_clip",
)


# Knobs whose default depends on how plans are proposed: "decode" keeps the settings
# its results were measured with; "edit"'s were chosen on the paper suite (the
# ablation in results/rl-ablation).
PROPOSAL_DEFAULTS: dict[str, dict[str, Any]] = {
    "edit": {
        "entropy_coef": 0.0,
        "reward": "parent",
        "elite_per_degrees": 1,
        "reheat_on": "repeat",
        "max_temperature": 2.0,
        "ppo_epochs": 1,
        "redraws": 4,
    },
    "decode": {
        "entropy_coef": 0.05,
        "reward": "log",
        "elite_per_degrees": 0,
        "reheat_on": "repeat",
        "max_temperature": 8.0,
        "ppo_epochs": 4,
        "redraws": 0,
    },
}


# The infeasible penalty by reward: just below its feasible range. A penalty far below
# it (5 under a rank reward in [0, 1]) teaches an edit policy to flee the memory limit,
# where the best plans of a large model sit (results/rl-ablation).
PENALTY_DEFAULTS: dict[str, dict[str, float]] = {
    "log": {"infeasible_base": 5.0, "infeasible_scale": 1.0},
    "rank": {"infeasible_base": 0.5, "infeasible_scale": 0.2},
    "parent": {"infeasible_base": 0.5, "infeasible_scale": 0.2},
}


@dataclass(frozen=True, kw_only=True)
class RLConfig:
    """Knobs of the policy, the learning rule and the reward. The method is the one of
    the "Learning to Shard" paper (attention policy over an elite history, PPO); the
    knobs marked *improvement* are additions, on by default only where they measurably
    helped (see the package docstring). Knobs left ``None`` take the default of the
    proposal (:data:`PROPOSAL_DEFAULTS`)."""

    # -- network (saved with a checkpoint; a loaded policy keeps its own) --
    proposal: Proposal = "edit"
    """How the policy proposes a plan: "edit" changes the decisions it chooses in an
    elite plan it chooses (:mod:`~shardlab.solvers.rl.edit`); "decode" builds every plan
    decision by decision from scratch (the paper's decoder,
    :mod:`~shardlab.solvers.rl.policy`)."""
    elite_encoding: EliteEncoding = "attention"
    """edit: how the elite history is read: "attention" (per decision across the elite
    plans, and pooled per plan) or "mean" (means over plans and decisions)."""
    d_model: int = 64
    """Width of every embedding, of the encoder and of the decoder state."""
    n_heads: int = 4
    """Attention heads of the elite-history encoder."""
    n_layers: int = 2
    """Transformer encoder layers over the elite plans and the query token."""
    ff_dim: int = 128
    """Feed-forward width inside each encoder layer."""
    logit_clip: float = 10.0
    """Candidate logits are ``logit_clip * tanh(logit / logit_clip)`` (Bello et al.'s
    pointer-network clipping), so no valid candidate's probability collapses to 0;
    0 disables."""

    # -- search --
    elite_size: int = 16
    """K: the best distinct plans so far that the encoder reads each iteration."""
    elite_per_degrees: int | None = None
    """*Improvement*: at most this many elite plans share one degree tuple (0: no cap), so
    the history keeps several degree regions in view instead of K variants of one.
    Default by proposal (:data:`PROPOSAL_DEFAULTS`): 1 for "edit" (the elite is the best
    plan of each of the K best tuples, each a parent of its own), 0 for "decode"."""
    start_recipes: bool = True
    """*Improvement*: the elite history starts with the engine's recipe plans
    (:func:`~shardlab.solvers.recipe.recipe_plans`: attention DP with wide EP for a
    DeepSeek-class model) besides the Megatron plans, so the first proposals edit what
    a user would deploy by following the engine's guide."""
    batch_size: int = 16
    """Plans sampled (and evaluated) per iteration."""
    elite_features: bool = True
    """*Improvement*: each candidate also carries how often the elite plans chose it
    (reward-weighted, given the sample's earlier decisions), a pointer into the elite
    history that lets the decoder copy and recombine good decisions from the start."""
    elite_prior: float = 4.0
    """*Improvement*: initial weight of a learned direct path from a candidate's elite share
    to its logit: > 0 starts the policy as a sampler around the elite plans (a
    cross-entropy-method prior) that PPO then reshapes; 0 leaves it to the network.
    Needs ``elite_features``."""
    edits: float = 2.0
    """edit: option and cut decisions an untrained policy changes per proposal (the
    offset of its stay logits; training moves it)."""
    class_edits: float = 1.0
    """edit: class moves (every decision of one operator in one layer kind set to one
    value) an untrained policy makes per proposal."""
    regroup_prior: float = -3.0
    """edit: initial shift of every class's "keep" logit in a proposal whose degree tuple
    changed (negative: such a proposal also re-chooses whole classes, whose best
    values differ between tuples; learned from there)."""
    rebase: bool = True
    """*Improvement*, edit: a proposal that moves to another degree tuple keeps the
    options of the best plan seen on that tuple (when one was seen) instead of its
    parent's, which were chosen for the parent's tuple; the elite's best per tuple are
    then the parents of every move between tuples."""
    retune: int = 3
    """*Improvement*, edit: a proposal that moves to a degree tuple no plan was seen on
    starts from its parent's options re-chosen for the new tuple by the cost tables:
    each option decision at its fastest valid option with the options around it held,
    ``retune`` rounds (each round prices the edges at the previous round's choices,
    :meth:`~shardlab.solvers.rl.costs.OptionCosts.fastest`); 0 keeps the parent's
    options. Options chosen for another tuple misprice a new one (on 1,024 H100 the
    optimum's tuple with the best recipe plan's options is at 0.59 of the optimum,
    0.995 re-chosen), so without it the search judges a tuple by a plan that was never
    meant for it."""
    probe: bool = True
    """*Improvement*, edit: each time the best plan lands on a degree tuple whose
    neighbours were not probed, those neighbours are evaluated once, the best plan
    retuned for each (``retune``): pp or tp doubled or halved with attention DP the
    other way, and EP doubled or halved. A few evaluations per new best; they join the
    elite as the recipe plans do. Off with ``retune=0``: the best plan's own options on
    another tuple say little about it. The policy's degree logits are learned from few
    samples of each value: on 1,024 H100 two seeds in five never proposed TP 2 with
    attention DP 32 (the optimum's tuple, 0.995 retuned from the best plan's options)
    in 5,000 evaluations and stayed at 0.971."""
    polish: int = 4
    """*Improvement*, edit: after ``polish`` iterations without a better plan, every
    class move of the best plan (one operator in one layer kind set to one of its valid
    options, :mod:`~shardlab.solvers.rl.edit`) is evaluated once, then, if none is
    better, every pair of moves of two consecutive operators of one layer kind
    (:func:`~shardlab.solvers.rl.features.class_edges`); from a better plan found, again,
    until none is better: a coordinate descent over the classes. 0 disables. At most 38
    single and 58 pair moves on the paper's 1.6T MoE, once per best plan. The policy's
    option logits are learned from its samples, so an option preferred elsewhere (a
    pretrained policy's, learned on other models) can outlast a search that has the
    right degree tuple, and a pair that pays only together is rarely sampled: on 1,024
    H100 the optimum's tuple stayed at 0.9957 with the shared experts' up and down
    projections replicated, where splitting either alone loses (results/rl-ablation)."""
    cost_features: bool = True
    """*Improvement*, edit: each option candidate's logit gains a learned per-operator
    weighting of what it costs under the proposal's degree tuple (its time and memory
    over the decision's cheapest, :mod:`~shardlab.solvers.rl.costs`), so a proposal on
    a new tuple re-chooses options by what they cost there, and a pretrained preference
    is about cost rather than option names."""
    cost_prior: float = 1.0
    """edit: initial weight on ``log(time / fastest)`` (an option twice as slow as the
    decision's fastest starts ``cost_prior * log 2`` lower); memory starts at 0."""
    degree_edit: float = 0.6
    """edit: probability that an untrained policy changes the parent's degree tuple."""
    reheat: float = 1.5
    """*Improvement*: sampling temperature is multiplied by this after an iteration that
    proposed no new plan (reset to 1 after one that did), so a converged policy keeps
    spending its budget instead of stalling; 1 disables it."""
    reheat_on: ReheatOn | None = None
    """When the temperature rises: after an iteration that proposed no new plan
    ("repeat", the default) or no plan better than the best so far ("stall": hotter
    proposals change more decisions at once, which near the memory limit of a large
    model makes most of them infeasible; results/rl-ablation)."""
    max_temperature: float | None = None
    """Ceiling of the reheated temperature while the iterations still propose new plans
    (default 2 for "edit", 8 for "decode")."""
    repeat_temperature: float = 8.0
    """Ceiling after an iteration that proposed no new plan at all: hot enough that a
    converged policy on a small space samples plans it has not tried (without it an
    edit policy whose neighbourhood is exhausted would repeat its elite forever)."""
    conserve: bool = True
    """edit: when a child's pipeline or tensor degree moves, its attention DP's stay
    logit sits on the value that keeps pp * tp * dp_attn the parent's (TP 1 to 2 with
    attention DP 16 to 8) rather than on the parent's value, which would double or halve
    the GPUs of each attention replica. Measured before ``probe``, over five seeds: GLM-4.5
    (32 H200) at 2,000 0.991 on average with it, 0.986 without; with the probes on,
    results/rl-ablation shows no difference."""
    degree_follow: bool = False
    """edit: the degree axes drawn after one that moved lose their stay logit, so a
    move re-chooses the rest of the tuple (TP 1 to 2 with attention DP 16 to 8, say)
    instead of keeping the parent's values, which suit the parent's tuple. Off by
    default: it finds GLM-4.5's optimum tuple on 32 H200 but loses the 1,024-GPU
    paper instance's on some seeds (results/rl-ablation)."""
    redraws: int | None = None
    """*Improvement*: a proposal that repeats a plan already evaluated (or an earlier one
    of its batch) is drawn again, up to this many times, before the batch is evaluated
    (default by proposal: 4 for "edit", 0 for "decode"). Early on most of an edit
    policy's children repeat an elite plan; with ``repeat_penalty`` alone the policy
    learns from them that any move beats staying, and drifts to moving several degree
    axes at once, away from the elite's region (on 1,024 H100 it never proposed the
    optimum's tuple). Redrawn, the batch teaches about new plans, and an iteration
    spends its learning step on 16 of them."""
    repeat_penalty: float = 1.0
    """*Improvement*: subtracted from the reward of a plan that was already evaluated
    (earlier, or earlier in the same batch): a re-proposal teaches nothing and costs an
    iteration, so the policy learns to propose new plans near the good ones; 0 disables."""

    # -- learning --
    algorithm: Algorithm = "ppo"
    """"ppo" (clipped surrogate) or "reinforce" (policy gradient with a moving baseline)."""
    lr: float = 2e-3
    """Adam learning rate."""
    ppo_epochs: int | None = None
    """Gradient steps on each batch (PPO; REINFORCE takes one). Default 1 for "edit"
    (more steps per batch converge its stay logits on the first good degree tuple; see
    results/rl-ablation), 4 for "decode"."""
    clip: float = 0.2
    """PPO ratio clip."""
    entropy_coef: float | None = None
    """Weight of the entropy bonus (default 0.05 for "decode", whose entropy is summed
    over a plan's decisions; 0 for "edit", whose exploration is its stay offsets and
    the reheat)."""
    baseline_decay: float = 0.9
    """REINFORCE: decay of the moving-average reward baseline."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip of every update."""
    baseline: bool = True
    """Subtract a baseline from the reward (PPO: the batch mean; REINFORCE: the moving
    average); False leaves the raw reward as the advantage."""
    normalize: bool = True
    """Divide the advantages by the batch's reward standard deviation."""

    # -- reward --
    reward: Reward | None = None
    """"log" (the default of "decode"): log of the objective over the Megatron plan's
    (below); "rank" (the default of "edit"): the share of the elite history a plan
    beats (0 to 1; infeasible plans keep the penalty below), which does not depend on
    how far apart objectives are and stays informative when every proposal is close to
    the elite; "parent" (edit): the mean of that share and whether the plan beats its
    parent (1, a tie 0.5), so improving an elite plan of a degree tuple behind the best
    pays too and the search tunes several tuples' options side by side instead of
    only the leading tuple's."""
    feasible_floor: float = 4.0
    """A feasible plan's reward, log(objective / reference), is at least ``-feasible_floor``."""
    infeasible_base: float | None = None
    """An infeasible plan gets ``-infeasible_base - infeasible_scale * log1p(excess)``:
    below every feasible plan, and worse the further it misses memory and the SLOs.
    Default by reward (:data:`PENALTY_DEFAULTS`): 5 for "log", 0.5 for the ranks, whose
    feasible rewards lie in [0, 1]."""
    infeasible_scale: float | None = None
    """Slope of the infeasible penalty in log1p of the relative miss (default 1 for
    "log", 0.2 for the ranks)."""

    def __post_init__(self) -> None:
        if self.proposal in PROPOSAL_DEFAULTS:
            for name, value in PROPOSAL_DEFAULTS[self.proposal].items():
                if getattr(self, name) is None:
                    object.__setattr__(self, name, value)
        for name, value in PENALTY_DEFAULTS.get(self.reward, {}).items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        check_choices(self, "rl config")
        for name in ("retune", "redraws", "polish"):
            if getattr(self, name) < 0:
                raise ShardlabError(
                    f"rl config: {name} must be 0 or more, not {getattr(self, name)}"
                )
        if self.edits <= 0 or self.class_edits <= 0 or not 0 < self.degree_edit < 1:
            raise ShardlabError(
                "rl config: edits and class_edits must be positive, degree_edit between 0 and 1"
            )
        for name in ("d_model", "n_heads", "n_layers", "ff_dim", "elite_size", "batch_size"):
            if getattr(self, name) < 1:
                raise ShardlabError(f"rl config: {name} must be at least 1")
        if self.d_model % self.n_heads:
            raise ShardlabError("rl config: d_model must be a multiple of n_heads")
        if self.ppo_epochs < 1 or self.lr <= 0 or self.clip <= 0:
            raise ShardlabError("rl config: ppo_epochs, lr and clip must be positive")
        if self.reheat < 1 or self.max_temperature < 1 or self.repeat_temperature < 1:
            raise ShardlabError(
                "rl config: reheat, max_temperature and repeat_temperature must be at least 1"
            )
        if self.feasible_floor <= 0 or self.infeasible_base <= 0:
            raise ShardlabError("rl config: feasible_floor and infeasible_base must be positive")
        if self.reward == "log" and self.infeasible_base < self.feasible_floor:
            raise ShardlabError(
                "rl config: infeasible_base must be at least feasible_floor so every "
                "infeasible plan scores below every feasible one"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RLConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def parse_knobs(text: str) -> dict[str, Any]:
    """``"lr=0.0005;ppo_epochs=1"`` as ``{"lr": 0.0005, "ppo_epochs": 1}``: knobs of
    :class:`RLConfig` by name, each value read as its field's type (``;`` separates them,
    as ``,`` and ``:`` separate methods and options on the command line)."""
    kinds = hints(RLConfig)
    out: dict[str, Any] = {}
    for pair in filter(None, (p.strip() for p in text.split(";"))):
        name, sep, value = pair.partition("=")
        if not sep or name not in kinds:
            raise ShardlabError(
                f"rl knobs {text!r}: {pair!r} is not NAME=VALUE with NAME one of "
                f"{', '.join(kinds)}",
                field="knobs",
            )
        try:
            out[name] = read_text(kinds[name], name, value, "rl knobs")
        except ShardlabError as exc:
            raise ShardlabError(str(exc), field="knobs") from None
    return out
