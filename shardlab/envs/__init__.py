"""Gymnasium environments of shardlab (gymnasium, not torch).

Importing this package registers ``shardlab/Sharding-v0`` (:class:`ShardingEnv`), so
``gymnasium.make("shardlab/Sharding-v0", instance="llama70b-h100x8-chat")`` works.
"""

from __future__ import annotations

import gymnasium

from shardlab.envs.sharding import ShardingEnv

ENV_ID = "shardlab/Sharding-v0"

if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point="shardlab.envs.sharding:ShardingEnv")

__all__ = ["ENV_ID", "ShardingEnv"]
