"""Every knob of the ``rl`` solver and of its pretraining, in one frozen dataclass."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

from shardlab.errors import ShardlabError
from shardlab.solvers.choices import ALGORITHMS

Algorithm = Literal["ppo", "reinforce"]
# Knobs that shape the network: a loaded checkpoint keeps its own.
NETWORK_FIELDS: tuple[str, ...] = ("d_model", "n_heads", "n_layers", "ff_dim", "logit_clip")


@dataclass(frozen=True, kw_only=True)
class RLConfig:
    """Knobs of the policy, the learning rule and the reward. Defaults are the method of
    the "Learning to Shard" paper (attention policy over an elite history, PPO); the
    knobs marked *improvement* are additions, on by default only where they measurably
    helped (see the package docstring)."""

    # -- network (saved with a checkpoint; a loaded policy keeps its own) --
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
    elite_per_degrees: int = 0
    """*Improvement*: at most this many elite plans share one degree tuple (0: no cap), so
    the history keeps several degree regions in view instead of K variants of one."""
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
    reheat: float = 1.5
    """*Improvement*: sampling temperature is multiplied by this after an iteration that
    proposed no new plan (reset to 1 after one that did), so a converged policy keeps
    spending its budget instead of stalling; 1 disables it."""
    max_temperature: float = 8.0
    """Ceiling of the reheated temperature."""
    repeat_penalty: float = 1.0
    """*Improvement*: subtracted from the reward of a plan that was already evaluated
    (earlier, or earlier in the same batch): a re-proposal teaches nothing and costs an
    iteration, so the policy learns to propose new plans near the good ones; 0 disables."""

    # -- learning --
    algorithm: Algorithm = "ppo"
    """"ppo" (clipped surrogate) or "reinforce" (policy gradient with a moving baseline)."""
    lr: float = 2e-3
    """Adam learning rate."""
    ppo_epochs: int = 4
    """Gradient steps on each batch (PPO; REINFORCE takes one)."""
    clip: float = 0.2
    """PPO ratio clip."""
    entropy_coef: float = 0.05
    """Weight of the entropy bonus (per-decision entropy, summed over a plan)."""
    baseline_decay: float = 0.9
    """REINFORCE: decay of the moving-average reward baseline."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip of every update."""

    # -- reward --
    feasible_floor: float = 4.0
    """A feasible plan's reward, log(objective / reference), is at least ``-feasible_floor``."""
    infeasible_base: float = 5.0
    """An infeasible plan gets ``-infeasible_base - infeasible_scale * log1p(excess)``:
    below every feasible plan, and worse the further it misses memory and the SLOs."""
    infeasible_scale: float = 1.0
    """Slope of the infeasible penalty in log1p of the relative miss."""

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ShardlabError(
                f"rl algorithm {self.algorithm!r} is unknown; use 'ppo' or 'reinforce'"
            )
        for name in ("d_model", "n_heads", "n_layers", "ff_dim", "elite_size", "batch_size"):
            if getattr(self, name) < 1:
                raise ShardlabError(f"rl config: {name} must be at least 1")
        if self.d_model % self.n_heads:
            raise ShardlabError("rl config: d_model must be a multiple of n_heads")
        if self.ppo_epochs < 1 or self.lr <= 0 or self.clip <= 0:
            raise ShardlabError("rl config: ppo_epochs, lr and clip must be positive")
        if self.reheat < 1 or self.max_temperature < 1:
            raise ShardlabError("rl config: reheat and max_temperature must be at least 1")
        if self.feasible_floor <= 0 or self.infeasible_base < self.feasible_floor:
            raise ShardlabError(
                "rl config: infeasible_base must be at least feasible_floor (> 0) so every "
                "infeasible plan scores below every feasible one"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RLConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})
