"""The ``rl`` solver: the "Learning to Shard" policy, trained by PPO over an elite history.

Method (one iteration; nothing depends on the budget, so the run is anytime):

1. the **elite history** is the ``elite_size`` best distinct plans evaluated so far
   (seeded by the Megatron plans priced for the reward's reference and, with
   ``start_recipes``, the engine's recipe plans; with ``elite_per_degrees`` at most
   that many of one degree tuple: edit keeps the best plan of each of the best tuples);
2. the **policy** reads it with attention and proposes ``batch_size`` new plans. Two
   ways (``proposal``): **"edit"** (the default, :mod:`~shardlab.solvers.rl.edit`)
   picks an elite plan and the decisions to change in it and what they become (a
   move to another degree tuple starts from the best plan seen there, ``rebase``; an
   option's logit weighs its cost under the tuple, ``cost_features``,
   :mod:`~shardlab.solvers.rl.costs`);
   **"decode"** (:mod:`~shardlab.solvers.rl.policy`, the paper's decoder) builds every
   plan decision by decision from scratch. Both mask every decision to the values
   valid given the others, so every proposal is a valid plan; an edit proposal that
   repeats a plan already evaluated is drawn again (``redraws``), so the batch the
   policy learns from is of new plans;
3. the plans go to the shared evaluator; their **reward** is their rank in the elite
   history averaged with whether they beat their parent (edit) or ``log(objective /
   megatron objective)`` (decode; latency: the inverse ratio); infeasible plans get
   ``-infeasible_base - infeasible_scale * log1p(miss)``, graded by how far they miss
   memory and the SLOs, just below the feasible range
   (:mod:`~shardlab.solvers.rl.reward`);
4. **PPO** (clipped surrogate, normalized advantages, optional entropy bonus; one
   step per batch for edit, four for decode; or REINFORCE with a moving baseline)
   updates the policy on the batch, and the elite
   history is updated. After an iteration that proposed no new plan the sampling
   temperature rises (``reheat_on``), up to ``max_temperature``.

Why two: with options chosen per layer (the paper's 1.6T MoE, ~800 decisions) a plan
decoded from scratch by a policy that has not yet learned each decision is mostly
noise, and one return is credited to 800 choices; the decoder stayed near random search
there (``results/rl-ablation``). The edit policy keeps what the elite history got right
and learns on the few decisions it changes.

Decisions (:mod:`~shardlab.solvers.rl.decisions`, shared with
:class:`shardlab.envs.ShardingEnv`): degrees first, one axis at a time (``pp``, ``tp``,
``dp_attn``, then ``ep`` for MoE models; ``replicas`` and ``etp`` follow), each masked
to values some valid degree tuple agrees with; then one decision per option variable
(masked by ``SearchSpace.mask``); then the pipeline cuts.

How one network serves every shape (:mod:`~shardlab.solvers.rl.features`): nothing the
network sees is indexed by a problem's sizes. A **decision** is embedded from what it
decides: its kind (pp/tp/dp_attn/ep/option/cut), the operator's name and the layer
group's kind (dense/moe/head) from fixed vocabularies built from
:mod:`shardlab.problems.operators`, the group's position and share of the layers, the
cut's position. A **candidate value** is embedded from what it means: a degree as
``log2(value) / log2(num_gpus)``, ``value == 1``, ``value <= gpus per node``; an option
by its name in a fixed vocabulary (column, row, seq_sharded, ...); a cut by its move
``(value - MAX_SHIFT) / MAX_SHIFT``; plus (``elite_features``) the reward-weighted share
of elite plans that chose it given the sample's earlier decisions. The decoder scores
each valid candidate by a dot product between its state and the candidate's embedding
(a pointer), so the number of decisions and of candidates can differ per problem. An
elite plan's token is the mean over its decisions of (decision + chosen candidate)
embeddings, with its reward and rank; the learned query token adds the problem's
context (log parameters, GPUs, node size, MoE, layers, HBM, batch, input/output
lengths, SLOs, phase, objective). The parameter count is the same for every problem,
so a policy pretrained on some instances (:func:`~shardlab.solvers.rl.train.train_policy`,
an initialization learned by Reptile) starts the search on others
(``get_solver("rl", policy=path)``).

torch is imported only by the modules that need it (``policy``, ``search``, ``solver``,
``checkpoint``, ``train``); ``decisions``, ``features``, ``costs``, ``reward`` and
``config`` are numpy only, for the gymnasium environment.
"""
