"""Measured serving from aiconfigurator-core's sample, as measurements to predict.

aiconfigurator-core 0.12.0 (a dependency of shardlab) ships
``aiconfigurator_core/systems/silicon_sample.csv``: 5,221 end-to-end serving
measurements, each the mean TTFT and mean TPOT of a benchmark at a fixed
concurrency, with the whole parallel layout of the run (aggregated, or a prefill and a
decode pool). It is read through the installed package (``importlib.resources``) and
never copied into shardlab; ``shardlab validate --measurements aiconfigurator-sample``
names it. A file of one's own in the same columns is read the same way.

How a row becomes a problem and a plan (each choice stated once):

- the model: the ``config.json`` aiconfigurator-core ships for the row's model
  (``model_configs/<org>--<name>_config.json``), read by structure like any other;
  where shardlab cannot read it, the catalog model of the same shapes in
  :data:`SHAPES_OF` (Kimi-K2.5's text model is Kimi-K2's); reports group models by
  the family in :data:`FAMILIES` (DeepSeek-R1 is a DeepSeek-V3);
- the GPUs: the catalog's GPU of the row's aiconfigurator system (:data:`GPUS`;
  a system the catalog does not hold is refused), ``tp * pp * attention_dp`` of them,
  in the accelerator's hosts (8 on an HGX board, 4 on a GB200 or GB300 tray, whose
  72-GPU NVLink domain the cluster keeps: a pool's groups up to 72 GPUs are priced on
  NVLink);
- the degrees: TP, PP and attention DP as stated, the MoE block's EP and TP from
  ``moe_ep_size`` and ``moe_tp_size`` (a dense model's are ignored); Megatron's
  operator options on them (what the engines run). Some rows write InferenceX's
  ``tp T, ep E`` runs as ``moe_tp_size`` T, ``moe_ep_size`` E and ``tp_size`` (or
  ``attention_dp_size``) ``T * E``: 64 GPUs for an 8-GPU run. Their ids say
  ``tp8_ep8``, and the same runs listed in the other files (``2026-03-25``) state
  ``tp_size`` 8, ``moe_tp_size`` 1 and ``moe_ep_size`` 8 with the same TTFT and TPOT.
  Such a row (``moe_tp_size`` = ``moe_ep_size`` > 1, their product the stated TP times
  attention DP) is read as that run: T GPUs, attention TP (or DP) T, experts over EP
  E, the same clients (:func:`_restated`). An aggregated MoE row over more than a
  host with no expert parallelism is refused: the sample's only such rows (GB200,
  ``2026-04-06``) state ``tp_size`` 12 to 72, mostly no TP degree of the model;
- precision: the GEMM quant mode gives the weights' format (``fp8`` and
  ``fp8_block``: fp8; ``nvfp4``: fp4; none: the row's precision, else bf16);
  ``int4_wo`` (4-bit weights, 16-bit math) has no counterpart and is refused. The
  sample states no KV-cache format: fp8 for TensorRT-LLM serving fp8 or fp4 weights
  (its quantized recipes set ``kv_cache_config.dtype: fp8``), else bf16 (vLLM's and
  SGLang's ``auto``);
- the load: ``batch_size`` is per attention-DP rank, so the benchmark's clients are
  ``batch_size * attention_dp`` (the ``silicon_concurrency`` the source string
  states agrees on 3,575 of 3,607 aggregated rows; a row where it does not says so
  in its note); the engine runs at most what its KV cache holds, the others wait.
  The closed loop is InferenceX's: 10 prompts per client, lengths uniform in
  [0.8, 1] x stated (its ``RANDOM_RANGE_RATIO``, :data:`RANGE_RATIO`);
- disaggregated rows: ``prefill_num_workers`` instances of the prefill layout at
  ``prefill_batch_size`` requests per rank and ``decode_num_workers`` of the decode
  layout at ``decode_batch_size``; rows that do not state the workers or batch sizes
  (most of the sample's) are refused, their pools' sizes unknown. Their clients are
  the stated concurrency. TTFT is the prefill pool's with the KV handoff, TPOT the
  decode pool's;
- the source's protocol: rows of InferenceX runs (``db-dump`` and the dated
  ``source_file`` rows) and aiconfigurator's own gap-analysis runs, whose client
  settings are not stated (their TPOT stays near a decode step's even when prompts
  are many times the output), are reported apart;
- rows repeating another row's setup and measurement (DeepSeek-R1's listed again as
  DeepSeek-V3's) are counted once.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from functools import lru_cache
from importlib import resources
from pathlib import Path

from shardlab.costmodel import silicon
from shardlab.errors import ShardlabError
from shardlab.problems.catalog import load_model
from shardlab.problems.cluster import builtin_accelerators, parse_cluster
from shardlab.problems.disagg import DisaggPlan
from shardlab.problems.engines import ENGINES
from shardlab.problems.model import Model
from shardlab.problems.plan import Degrees
from shardlab.problems.problem import Problem
from shardlab.problems.workload import Workload
from shardlab.validation.measurements import Measurement, MeasurementSet, Refusal, read_csv
from shardlab.validation.protocol import Pools, disagg_plan

SAMPLE = "aiconfigurator-sample"
SAMPLE_COLUMNS = frozenset(
    {
        "id",
        "backend",
        "model_path",
        "system",
        "mode",
        "isl",
        "osl",
        "batch_size",
        "tp_size",
        "silicon_ttft_ms",
        "silicon_tpot_ms",
    }
)
# aiconfigurator-core's system -> the catalog's GPU: every system with measured tables
# (silicon.SYSTEMS), and the estimate-only ones the catalog holds (timed by the roofline).
GPUS = {
    **{system: key for key, system in silicon.SYSTEMS.items()},
    "h100_pcie": "h100pcie",
    "l4": "l4",
}
# Catalog models of the same shapes, for configs shardlab cannot read as shipped.
SHAPES_OF = {"moonshotai/Kimi-K2.5": "kimi-k2"}
# The family each model path is reported (and held out) under.
FAMILIES = {
    "deepseek-ai/DeepSeek-R1": "deepseek-v3",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-v3",
    "nvidia/DeepSeek-V3.1-NVFP4": "deepseek-v3",
    "meta-llama/Llama-3.1-70B": "llama-3.1",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1",
    "Qwen/Qwen3-32B": "qwen3",
    "nvidia/Qwen3-32B-NVFP4": "qwen3",
    "Qwen/Qwen3-235B-A22B-FP8": "qwen3",
    "Qwen/Qwen3.5-397B-A17B": "qwen3.5",
    "openai/gpt-oss-120b": "gpt-oss",
    "moonshotai/Kimi-K2.5": "kimi-k2",
    "zhipuai/GLM-5": "glm-5",
    "MiniMaxAI/MiniMax-M2.5": "minimax-m2",
}
# The config file aiconfigurator-core ships for a model path, where its name differs.
CONFIG_NAMES = {
    "meta-llama/Llama-3.1-70B": "meta-llama--Meta-Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B-Instruct": "meta-llama--Meta-Llama-3.1-8B",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama--Meta-Llama-3.1-8B",
    "nvidia/Qwen3-32B-NVFP4": "Qwen--Qwen3-32B",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-ai--DeepSeek-R1",
    "zhipuai/GLM-5": "nvidia--GLM-5-NVFP4",
}
WEIGHTS = {"fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4", "bfloat16": "bf16"}
PRECISIONS = {"bf16": "bf16", "fp8": "fp8", "fp4": "fp4"}


def sample_path() -> Path:
    """The sample inside the installed aiconfigurator-core package."""
    try:
        base = resources.files("aiconfigurator_core")
    except ModuleNotFoundError:
        raise ShardlabError(
            f"measurements {SAMPLE}: aiconfigurator-core is not installed",
            field="measurements",
            fix="pip install aiconfigurator-core==0.12.0",
        ) from None
    return Path(str(base / "systems" / "silicon_sample.csv"))


def read_sample(**filters: Iterable[str] | None) -> MeasurementSet:
    """The sample's rows as measurements, two per row (TTFT and TPOT); the rows that
    cannot be priced, refused with their reasons. ``filters`` (see
    :func:`sample_rows`) keep some rows."""
    return sample_rows(read_csv(sample_path()), SAMPLE, **filters)


def sample_rows(
    rows: list[dict[str, str]],
    source: str,
    *,
    gpu: Iterable[str] | None = None,
    backend: Iterable[str] | None = None,
    family: Iterable[str] | None = None,
    mode: Iterable[str] | None = None,
    protocol: Iterable[str] | None = None,
) -> MeasurementSet:
    """Rows in the sample's columns as measurements (see :func:`read_sample`), kept
    when their GPU, engine, model family, mode and protocol are among the ones given."""
    # keyed by the filter's name
    keep = {
        "gpu": _chosen(gpu, set(GPUS.values()), "gpu"),
        "backend": _chosen(backend, set(ENGINES), "backend"),
        "family": _chosen(family, set(FAMILIES.values()), "family"),
        "mode": _chosen(mode, {"agg", "disagg"}, "mode"),
        "protocol": _chosen(protocol, {"inferencex", "gap-analysis"}, "protocol"),
    }
    out: list[Measurement] = []
    refused: list[Refusal] = []
    seen: set[tuple] = set()
    duplicates = 0
    for line, row in enumerate(rows, start=2):
        system = (row.get("system") or "").strip()
        facts = {
            "gpu": GPUS.get(system, system),
            "backend": (row.get("backend") or "").strip(),
            "family": FAMILIES.get((row.get("model_path") or "").strip(), ""),
            "mode": (row.get("mode") or "").strip(),
            "protocol": _protocol(row.get("silicon_data_source") or ""),
        }
        if any(v is not None and facts[k] not in v for k, v in keep.items()):
            continue
        rid = (row.get("id") or "").strip() or f"line {line}"
        try:
            row = _restated(row)
            pair = _measurements(row, rid)
        except ShardlabError as exc:
            refused.append(Refusal(id=rid, line=line, reason=str(exc)))
            continue
        key = _setup_key(row)
        if key in seen:
            duplicates += 1
            continue
        seen.add(key)
        out += pair
    if not out and not refused:
        asked = ", ".join(f"{k} {','.join(sorted(v))}" for k, v in keep.items() if v is not None)
        raise ShardlabError(
            f"measurements {source!r}: no row matches {asked or 'the file'}",
            field="filters" if asked else "measurements",
        )
    return MeasurementSet(
        source=source, rows=out, refused=refused, duplicates=duplicates, serving=True
    )


def _chosen(values: Iterable[str] | None, known: set[str], name: str) -> set[str] | None:
    if values is None:
        return None
    chosen = {v.strip().lower() for v in values}
    unknown = sorted(chosen - known)
    if unknown:
        raise ShardlabError(
            f"{name} {', '.join(unknown)}: not one of {', '.join(sorted(known))}",
            field=name,
        )
    return chosen


_LAYOUT = (
    "tp_size",
    "pp_size",
    "attention_dp_size",
    "moe_tp_size",
    "moe_ep_size",
    *(f"{pool}_{k}" for pool in ("prefill", "decode") for k in (
        "batch_size", "num_workers", "tp_size", "pp_size", "attention_dp_size",
        "moe_tp_size", "moe_ep_size",
    )),
)  # fmt: skip


def _setup_key(row: Mapping[str, str]) -> tuple:
    """A row's setup and measurement, with the model by what it is read as."""
    path = (row.get("model_path") or "").strip()
    names = ("system", "backend", "mode", "precision", "gemm_quant_mode", "isl", "osl")
    return (
        _config_name(path),
        *((row.get(k) or "").strip() for k in names),
        *(_number(row, k) for k in ("batch_size", *_LAYOUT)),
        _number(row, "silicon_ttft_ms"),
        _number(row, "silicon_tpot_ms"),
    )


def _number(row: Mapping[str, str], key: str) -> float | None:
    text = (row.get(key) or "").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        raise ShardlabError(f"{key} {text!r} is not a number") from None
    return None if math.isnan(value) else value


def _count(row: Mapping[str, str], key: str, default: int | None = None) -> int:
    value = _number(row, key)
    if value is None:
        if default is None:
            raise ShardlabError(f"no {key}")
        return default
    if value < 1 or value != int(value):
        raise ShardlabError(f"{key} must be a positive integer, got {row.get(key)!r}")
    return int(value)


def _config_name(path: str) -> str:
    return CONFIG_NAMES.get(path, path.replace("/", "--"))


@lru_cache(maxsize=64)
def _model(path: str) -> Model:
    """The model of a sample row's model path (see the module docstring)."""
    shipped = resources.files("aiconfigurator_core") / "model_configs"
    config = shipped / f"{_config_name(path)}_config.json"
    if not config.is_file():
        if path in SHAPES_OF:
            return load_model(SHAPES_OF[path])
        raise ShardlabError(f"model {path!r}: aiconfigurator-core ships no config.json for it")
    try:
        return load_model(str(config))
    except ShardlabError as exc:
        if path in SHAPES_OF:
            return load_model(SHAPES_OF[path])
        raise ShardlabError(f"model {path!r}: {exc}") from None


def _weights(row: Mapping[str, str]) -> str:
    quant = (row.get("gemm_quant_mode") or "").strip()
    if quant == "int4_wo":
        raise ShardlabError(
            "weights int4_wo (4-bit weights, 16-bit math) have no counterpart in shardlab's "
            "formats (bf16, fp8, fp4)"
        )
    if quant:
        if quant not in WEIGHTS:
            raise ShardlabError(f"gemm_quant_mode {quant!r} is not one of {', '.join(WEIGHTS)}")
        return WEIGHTS[quant]
    return PRECISIONS.get((row.get("precision") or "").strip(), "bf16")


def _degrees(row: Mapping[str, str], prefix: str, model: Model) -> Degrees:
    tp = _count(row, f"{prefix}tp_size")
    pp = _count(row, f"{prefix}pp_size", 1)
    dp = _count(row, f"{prefix}attention_dp_size", 1)
    if model.moe is None:
        return Degrees(pp=pp, tp=tp, dp_attn=dp, ep=1, etp=tp * dp)
    ep = _count(row, f"{prefix}moe_ep_size", 1)
    etp = _count(row, f"{prefix}moe_tp_size", tp * dp // ep or 1)
    return Degrees(pp=pp, tp=tp, dp_attn=dp, ep=ep, etp=etp)


def _restated(row: Mapping[str, str]) -> Mapping[str, str]:
    """An aggregated row as the run it measured: one that writes InferenceX's ``tp T,
    ep E`` as ``moe_tp_size`` T = ``moe_ep_size`` E and ``tp_size * attention_dp_size``
    = T * E (see the module docstring) becomes T GPUs of attention TP T (or DP T, its
    ``batch_size`` per rank scaled so that the clients stay those stated) and experts
    over EP E; any other row is returned as it is."""
    if (row.get("mode") or "").strip() != "agg":
        return row
    tp, dp = _number(row, "tp_size"), _number(row, "attention_dp_size") or 1.0
    moe_tp, moe_ep = _number(row, "moe_tp_size"), _number(row, "moe_ep_size")
    if tp is None or moe_tp is None or moe_ep is None:
        return row
    if not (moe_tp == moe_ep > 1 and tp * dp == moe_tp * moe_ep and min(tp, dp) == 1):
        return row
    gpus = int(moe_tp)
    restated = {**row, "moe_tp_size": "1", "moe_ep_size": str(int(moe_ep))}
    if dp > 1:
        batch = _number(row, "batch_size")
        restated["attention_dp_size"] = str(gpus)
        if batch is not None:
            restated["batch_size"] = str(int(batch * dp) // gpus)
    else:
        restated["tp_size"] = str(gpus)
    return restated


# InferenceX draws each prompt's and output's length uniformly in [0.8, 1] x nominal.
RANGE_RATIO = 0.8


def _protocol(source: str) -> str:
    return "gap-analysis" if "gap-analysis" in source else "inferencex"


def _measurements(row: Mapping[str, str], rid: str) -> list[Measurement]:
    """A row's TTFT and TPOT measurements (refused with the reason it cannot be)."""
    system = (row.get("system") or "").strip()
    if system not in GPUS:
        raise ShardlabError(
            f"system {system!r}: not one of the aiconfigurator-core systems shardlab's "
            f"catalog holds ({', '.join(sorted(GPUS))})"
        )
    engine = (row.get("backend") or "").strip()
    if engine not in ENGINES:
        raise ShardlabError(f"backend {engine!r} is not one of {', '.join(ENGINES)}")
    path = (row.get("model_path") or "").strip()
    model = _model(path)
    weights = _weights(row)
    kv = "fp8" if engine == "trtllm" and weights in ("fp8", "fp4") else "bf16"
    values = {k: _number(row, f"silicon_{k}") for k in ("ttft_ms", "tpot_ms")}
    for key, value in values.items():
        if value is None or value <= 0:
            raise ShardlabError(f"silicon_{key} must be a positive number")
    source = (row.get("silicon_data_source") or "").strip()
    stated = re.search(r"silicon_concurrency=(\d+)", source)
    mode = (row.get("mode") or "").strip()
    try:
        if mode == "agg":
            problem, degrees, plan, requests_per_rank, note = _agg(
                row, model, engine, weights, kv, stated
            )
        elif mode == "disagg":
            problem, degrees, plan, requests_per_rank, note = _disagg(
                row, model, engine, weights, kv, stated
            )
        else:
            raise ShardlabError(f"mode {mode!r} is not agg or disagg")
    except (ShardlabError, ValueError, TypeError) as exc:
        raise ShardlabError(str(exc)) from None
    setup = (
        f"{path} on {problem.cluster.name} with {engine} {row.get('backend_version') or ''}".strip()
        + f", {weights} weights"
    )
    common = {
        "unit": "ms",
        "setup": setup,
        "note": note,
        "source": source,
        "cluster": problem.cluster,
        "problem": problem,
        "degrees": degrees,
        "message_bytes": None,
        "engine": engine,
        "disagg": plan,
        "family": FAMILIES.get(path, model.name),
        "requests_per_rank": requests_per_rank,
        "mode": mode,
        "protocol": _protocol(source),
    }
    return [
        Measurement(id=rid, metric=metric, value=float(value), **common)  # type: ignore[arg-type]
        for metric, value in values.items()
    ]


def _workload(row: Mapping[str, str], clients: int, weights: str, kv: str) -> Workload:
    return Workload(
        name="measured",
        phase="request",
        schedule="inflight",
        batch=clients,
        clients=clients,
        input_len=_count(row, "isl"),
        output_len=_count(row, "osl"),
        weight_dtype=weights,  # type: ignore[arg-type]
        kv_dtype=kv,  # type: ignore[arg-type]
    )


def _problem(
    row: Mapping[str, str], model: Model, engine: str, workload: Workload, gpus: int
) -> Problem:
    cluster = parse_cluster(f"{GPUS[row['system'].strip()]}x{gpus}")
    return Problem(model=model, cluster=cluster, workload=workload, engine=engine)  # type: ignore[arg-type]


def _agg(
    row: Mapping[str, str],
    model: Model,
    engine: str,
    weights: str,
    kv: str,
    stated: re.Match | None,
) -> tuple[Problem, Degrees, None, int, str]:
    d = _degrees(row, "", model)
    host = builtin_accelerators()[GPUS[row["system"].strip()]].gpus_per_node
    if model.moe is not None and d.ep == 1 and d.num_gpus > host:
        # only the sample's GB200 rows of 2026-04-06 are so; 53 of their 55 tp_size
        # values (12 to 72, with moe_ep_size 1) are no TP degree of DeepSeek-R1's heads
        raise ShardlabError(
            f"an aggregated row of an MoE model as tensor parallelism alone over {d.num_gpus} "
            "GPUs, more than a host (moe_ep_size 1): the sample's rows so state tp_size 12 "
            "to 72, mostly no TP degree of the model; the layout run is unknown"
        )
    requests_per_rank = _count(row, "batch_size")
    clients = requests_per_rank * d.dp_attn
    note = ""
    if stated is not None and int(stated.group(1)) != clients:
        note = f"the source states concurrency {stated.group(1)}; batch_size gives {clients}"
    problem = _problem(row, model, engine, _workload(row, clients, weights, kv), d.num_gpus)
    problem.space.degree_index(d)  # refused here when the model cannot run the degrees
    return problem, d, None, requests_per_rank, note


def _disagg(
    row: Mapping[str, str],
    model: Model,
    engine: str,
    weights: str,
    kv: str,
    stated: re.Match | None,
) -> tuple[Problem, Degrees, DisaggPlan, int, str]:
    sizes = ("prefill_num_workers", "decode_num_workers", "prefill_batch_size", "decode_batch_size")
    if any(_number(row, k) is None for k in sizes):
        raise ShardlabError(
            "a disaggregated row without worker counts and batch sizes: the pools' sizes are "
            "unknown"
        )
    dp_, dd = _degrees(row, "prefill_", model), _degrees(row, "decode_", model)
    x, y = _count(row, "prefill_num_workers"), _count(row, "decode_num_workers")
    bp, bd = _count(row, "prefill_batch_size"), _count(row, "decode_batch_size")
    clients = int(stated.group(1)) if stated is not None else bd * dd.dp_attn * y
    pools = Pools(prefill=dp_, prefill_instances=x, decode=dd, decode_instances=y)
    gpus = pools.num_gpus
    host = builtin_accelerators()[GPUS[row["system"].strip()]].gpus_per_node
    hosts = -(-gpus // host)  # the hosts the pools take, some GPUs of the last maybe idle
    problem = _problem(
        row,
        model,
        engine,
        _workload(row, clients, weights, kv),
        hosts * host if gpus > host else gpus,
    )
    plan = disagg_plan(problem, pools, prefill_requests=bp, decode_requests=bd)
    return problem, dd, plan, bd, ""
