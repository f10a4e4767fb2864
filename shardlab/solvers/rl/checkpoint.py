"""Saving and loading a policy: its ``state_dict``, its knobs and its training state,
written whole or not at all (:func:`shardlab.files.replacing`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from shardlab.errors import ShardlabError
from shardlab.files import replacing
from shardlab.solvers.rl.config import NETWORK_FIELDS, PROPOSAL_DEFAULTS, RLConfig

FORMAT = "shardlab.rl-policy/1"


def save_checkpoint(
    path: str | Path,
    policy: nn.Module,
    config: RLConfig,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    extra: dict[str, Any] | None = None,
) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "format": FORMAT,
        "config": config.to_dict(),
        "state_dict": policy.state_dict(),
        "optimizer": optimizer.state_dict() if optimizer is not None else None,
        "extra": extra or {},
    }
    with replacing(path) as tmp:
        torch.save(data, tmp)
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """The checkpoint's contents; a missing or unreadable file raises ShardlabError."""
    path = Path(path)
    if not path.is_file():
        raise ShardlabError(
            f"policy checkpoint {str(path)!r} does not exist",
            field="policy",
            fix="give the file train_policy wrote, or no policy to start from scratch",
        )
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # torch raises many types for a damaged file
        raise ShardlabError(
            f"policy checkpoint {str(path)!r} cannot be read ({type(e).__name__}); it is "
            "not a shardlab policy or is damaged: train it again with train_policy"
        ) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ShardlabError(
            f"policy checkpoint {str(path)!r} is not a {FORMAT} file; train it again with "
            "train_policy"
        )
    return data


def load_policy(path: str | Path, config: RLConfig | None = None) -> tuple[nn.Module, RLConfig]:
    """The saved policy, with ``config``'s search knobs and the checkpoint's network knobs."""
    from shardlab.solvers.rl.search import build_policy

    data = load_checkpoint(path)
    # a checkpoint written before policies could edit holds the decoder
    saved = RLConfig.from_dict({"proposal": "decode"} | data["config"])
    if config is None:
        config = saved
    else:
        merged = config.to_dict()
        if saved.proposal != config.proposal:  # the saved network's proposal sets them
            merged = {k: v for k, v in merged.items() if k not in PROPOSAL_DEFAULTS["edit"]}
        merged |= {k: getattr(saved, k) for k in NETWORK_FIELDS}
        merged["elite_features"] = saved.elite_features
        config = RLConfig.from_dict(merged)
    policy = build_policy(config)
    try:
        policy.load_state_dict(data["state_dict"])
    except (RuntimeError, KeyError) as e:
        raise ShardlabError(
            f"policy checkpoint {str(path)!r} does not match this version of the rl policy "
            f"({str(e).splitlines()[0]}); train it again with train_policy"
        ) from None
    return policy, config
