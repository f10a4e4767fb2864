"""Sharding the reference model as a plan says: the ``ParallelStyle`` of every
option, applied with ``parallelize_module``."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from shardlab.dtensor_check.dense import SwiGLUUp
from shardlab.dtensor_check.edges import Styles, _PlanState, torch_placement
from shardlab.dtensor_check.experts import Experts, _ExpertSharding
from shardlab.dtensor_check.mixers import _HeadSlice
from shardlab.dtensor_check.transformer import TinyTransformer
from shardlab.errors import ShardlabError
from shardlab.problems.model import Model
from shardlab.problems.operators import (
    HEAD_OPS,
    OptionSpec,
    layer_ops,
)
from shardlab.problems.placements import MESH_AXES
from shardlab.problems.plan import Plan


def _linear_weight_placements(opt: OptionSpec, axes: tuple[str, ...]) -> list[Any]:
    """Placement of an ``nn.Linear`` weight ``[out, in]`` on each mesh axis."""
    out = []
    for axis, i, o in zip(MESH_AXES, opt.inp, opt.out, strict=True):
        if axis not in axes:
            continue
        if o.kind == "S" and o.dim == "hid":
            out.append(Shard(0))  # output features split: column-parallel
        elif i.kind == "S" and i.dim == "hid":
            out.append(Shard(1))  # input features split: row-parallel
        else:
            out.append(Replicate())
    return out


def _embedding_weight_placements(opt: OptionSpec, axes: tuple[str, ...]) -> list[Any]:
    return [
        Shard(0) if o.kind == "P" else Replicate()
        for axis, o in zip(MESH_AXES, opt.out, strict=True)
        if axis in axes
    ]


class OptionParallel(ParallelStyle):
    """One operator option on the 2-D ``(dp, tp)`` mesh.

    The weights of every ``nn.Linear``/``nn.Embedding`` inside become DTensors placed as
    the option says (output features split where the option outputs ``S(hid)``, input
    features where it reads ``S(hid)`` and returns partial sums, vocabulary rows where
    the embedding returns partial sums); other parameters are replicated. With
    ``local=True`` the module computes on local shards: its DTensor inputs (already in
    ``inp``: the model redistributes on every edge) are unwrapped and its output is
    wrapped with the ``out`` placements, like ``PrepareModuleInputOutput``.
    """

    def __init__(self, opt: OptionSpec, *, local: bool = False) -> None:
        super().__init__()
        self.opt = opt
        self.local = local

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        axes = MESH_AXES
        if not self.local:
            for sub in module.modules():
                if isinstance(sub, nn.Linear):
                    placements = _linear_weight_placements(self.opt, axes)
                elif isinstance(sub, nn.Embedding):
                    placements = _embedding_weight_placements(self.opt, axes)
                else:
                    placements = [Replicate()] * len(axes)
                for name, p in list(sub.named_parameters(recurse=False)):
                    d = distribute_tensor(p.detach(), device_mesh, placements, src_data_rank=None)
                    sub.register_parameter(name, nn.Parameter(d, requires_grad=False))
            return module
        out = [torch_placement(p) for p in self.opt.out]

        def pre(_mod: nn.Module, args: tuple) -> tuple:
            return tuple(a.to_local() if isinstance(a, DTensor) else a for a in args)

        def post(_mod: nn.Module, _args: tuple, result: torch.Tensor) -> DTensor:
            return DTensor.from_local(result, device_mesh, out, run_check=False)

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
        return module


class ExpertParallel(ParallelStyle):
    """Routed experts split over ``ep`` ranks (each over ``etp``), local weights only.

    ``alltoall``: tokens arrive split over every rank, are dispatched to the ranks that
    own their experts and combined back with ``all_to_all_single`` (``etp = 1``).
    ``allgather``: every rank holds every token and returns partial sums.
    """

    def __init__(self, opt: OptionSpec, *, ep: int, etp: int, rank: int, layer: int) -> None:
        super().__init__()
        self.opt, self.ep, self.etp, self.rank, self.layer = opt, ep, etp, rank, layer

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        assert isinstance(module, Experts)
        if self.opt.name == "alltoall" and self.etp != 1:
            raise ShardlabError(
                "experts alltoall with etp > 1 (gather/scatter inside each expert group) is "
                "not implemented by the check; use degrees with etp = 1"
            )
        e_idx, t_idx = divmod(self.rank, self.etp)
        local = module.num_experts // self.ep
        width = module.w_gate.shape[1] // self.etp
        es = slice(e_idx * local, (e_idx + 1) * local)
        fs = slice(t_idx * width, (t_idx + 1) * width)
        with torch.no_grad():
            module.w_gate = nn.Parameter(module.w_gate[es, fs].clone(), requires_grad=False)
            module.w_up = nn.Parameter(module.w_up[es, fs].clone(), requires_grad=False)
            module.w_down = nn.Parameter(module.w_down[es, :, fs].clone(), requires_grad=False)
        module.sharding = _ExpertSharding(
            option=self.opt.name, ep=self.ep, etp=self.etp, rank=self.rank, layer=self.layer
        )
        mesh = device_mesh
        out = [torch_placement(p) for p in self.opt.out]
        if mesh.ndim == 1:  # styles="torch": only the tp axis is a mesh axis
            out = out[1:]

        def pre(_mod: nn.Module, args: tuple) -> tuple:
            return tuple(a.to_local() if isinstance(a, DTensor) else a for a in args)

        def post(_mod: nn.Module, _args: tuple, result: torch.Tensor) -> DTensor:
            return DTensor.from_local(result, mesh, out, run_check=False)

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)
        return module


def _local(opt: OptionSpec) -> ParallelStyle:
    """torch's style for a module that computes on its local shard of the tp mesh."""
    tp_in, tp_out = torch_placement(opt.inp[1]), torch_placement(opt.out[1])
    return PrepareModuleInputOutput(
        input_layouts=(tp_in,),
        desired_input_layouts=(tp_in,),
        use_local_input=True,
        output_layouts=tp_out,
        desired_output_layouts=tp_out,
        use_local_output=False,
    )


def _torch_style(op: str, opt: OptionSpec, module: nn.Module) -> dict[str, ParallelStyle]:
    """torch's own 1-D styles on the tp mesh for one operator option (``styles="torch"``)."""

    linears = [n for n, _ in module.named_children()] if isinstance(module, SwiGLUUp) else [""]
    if op in ("attention", "sampler"):
        return {"": _local(opt)}
    if opt.name == "replicated":
        # Whole weights on every rank: compute on the local tensor.
        return {"": _local(opt)}
    if opt.name == "seq_sharded":
        return {n: SequenceParallel(sequence_dim=0) for n in linears}
    if opt.name == "column":
        return {
            n: ColwiseParallel(input_layouts=Replicate(), use_local_output=False) for n in linears
        }
    if opt.name == "row":
        return {
            "": RowwiseParallel(
                input_layouts=Shard(-1), output_layouts=Partial(), use_local_output=False
            )
        }
    raise ShardlabError(f"{op}: option {opt.name} has no torch style (it needs the dp axis)")


def torch_styles_supported(plan: Plan, model: Model) -> bool:
    """Whether every operator keeps requests split over dp (``styles="torch"`` works)."""
    for kind, opts in zip(model.layer_kinds, plan.layer_options, strict=True):
        for op, name in zip(layer_ops(model, kind), opts, strict=True):
            if op.name == "experts" and name == "allgather" and plan.degrees.dp_attn > 1:
                return False
            if name in ("column_full", "row_full"):
                return False
    return True


def apply_plan(
    net: TinyTransformer, plan: Plan, mesh: DeviceMesh, *, styles: Styles = "mesh"
) -> TinyTransformer:
    """Shard ``net`` in place as ``plan`` says, with ``parallelize_module`` on ``mesh``.

    ``mesh`` is the ``(dp_attn, tp)`` mesh with dimension names ``("dp", "tp")``.
    ``styles="mesh"``: :class:`OptionParallel` on the 2-D mesh; ``styles="torch"``:
    torch's own styles on ``mesh["tp"]`` (see the module docstring).
    """
    _refuse_unrunnable(net, plan, mesh, styles)
    m = net.model
    layers = [
        {op.name: op.option(name) for op, name in zip(layer_ops(m, kind), opts, strict=True)}
        for kind, opts in zip(m.layer_kinds, plan.layer_options, strict=True)
    ]
    head = {op.name: op.option(name) for op, name in zip(HEAD_OPS, plan.head_options, strict=True)}
    if styles == "mesh":
        state = _PlanState(mesh=mesh, axes=MESH_AXES, layers=layers, head=head, styles=styles)
        target = mesh
    else:
        state = _PlanState(mesh=mesh["tp"], axes=("tp",), layers=layers, head=head, styles=styles)
        target = mesh["tp"]
    plan_styles = _plan_styles(net, plan, mesh, state)
    for block in net.layers:
        block.plan = state
    parallelize_module(net, target, plan_styles, src_data_rank=None)
    net.plan = state
    return net


def _refuse_unrunnable(net: TinyTransformer, plan: Plan, mesh: DeviceMesh, styles: Styles) -> None:
    """Refuse a plan, mesh or style set the check cannot run on ``net``."""
    d = plan.degrees
    if d.pp != 1 or d.replicas != 1:
        raise ShardlabError(
            f"degrees {d.short()}: the check runs one pipeline stage of one replica "
            "(pp = replicas = 1)"
        )
    if tuple(mesh.shape) != (d.dp_attn, d.tp) or mesh.mesh_dim_names != MESH_AXES:
        raise ShardlabError(
            f"mesh {tuple(mesh.shape)} {mesh.mesh_dim_names} is not (dp_attn, tp) = "
            f"({d.dp_attn}, {d.tp}) named {MESH_AXES}"
        )
    if net.groups != d.tp:
        raise ShardlabError(
            f"the model groups its QKV heads for tp={net.groups}, the plan has tp={d.tp}"
        )
    if styles == "torch" and not torch_styles_supported(plan, net.model):
        raise ShardlabError(
            "styles='torch': the plan gathers tokens over dp (column_full, row_full or "
            "allgather experts), which torch's 1-D styles cannot express; use styles='mesh'"
        )


def _plan_styles(
    net: TinyTransformer, plan: Plan, mesh: DeviceMesh, state: _PlanState
) -> dict[str, ParallelStyle]:
    """The ``ParallelStyle`` of every sharded sub-module of ``net``, by its name; the
    modules that compute some head groups on local weights learn which."""
    d, styles = plan.degrees, state.styles
    rank = dist.get_rank(mesh.get_group("dp")) * d.tp + dist.get_rank(mesh.get_group("tp"))
    local_ops = ("attention", "sampler")
    tp_rank = dist.get_rank(mesh.get_group("tp"))
    plan_styles: dict[str, ParallelStyle] = {}

    def add(fqn: str, op: str, opt: OptionSpec, module: nn.Module) -> None:
        if isinstance(module, _HeadSlice):
            # Head groups on local weights: the tp rank's groups when the option splits them.
            split = "tp" in opt.weight_axes and d.tp > 1
            module.first_group = tp_rank if split else 0
            module.local_groups = 1 if split else None
            plan_styles[fqn] = OptionParallel(opt, local=True) if styles == "mesh" else _local(opt)
            return
        if styles == "mesh":
            plan_styles[fqn] = OptionParallel(opt, local=op in local_ops)
            return
        for sub, style in _torch_style(op, opt, module).items():
            plan_styles[f"{fqn}.{sub}" if sub else fqn] = style

    for name in ("embedding", "final_norm", "lm_head", "sampler"):
        opt = state.head[name]
        if styles == "torch" and name == "embedding":
            plan_styles["embedding"] = _torch_embedding_style(opt, state.layers[0]["residual"])
            continue
        add(name, name, opt, getattr(net, name))
    for i, block in enumerate(net.layers):
        for op, opt in state.layers[i].items():
            if op == "residual":
                continue
            if op == "experts":
                plan_styles[f"layers.{i}.experts"] = ExpertParallel(
                    opt, ep=d.ep, etp=d.etp, rank=rank, layer=i
                )
            else:
                add(f"layers.{i}.{op}", op, opt, getattr(block, op))
    return plan_styles


def _torch_embedding_style(opt: OptionSpec, residual: OptionSpec) -> ParallelStyle:
    tp_out = torch_placement(opt.out[1])
    if opt.name == "vocab_sharded":
        # The output of a vocabulary-sharded embedding is a masked partial sum that
        # DTensor only lets RowwiseParallel turn into the residual's layout directly.
        return RowwiseParallel(
            input_layouts=Replicate(),
            output_layouts=torch_placement(residual.inp[1]),
            use_local_output=False,
        )
    if opt.name == "seq_sharded":
        return SequenceParallel(sequence_dim=0)
    return PrepareModuleInputOutput(
        input_layouts=(Replicate(),),
        desired_input_layouts=(Replicate(),),
        use_local_input=True,
        output_layouts=tp_out,
        desired_output_layouts=tp_out,
        use_local_output=False,
    )
