"""What is built in: models, GPUs, workload presets, engines, methods, a space's size."""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict

from rich.table import Table

from shardlab.cli.app import Format, FormatOpt, app
from shardlab.cli.options import problem_command
from shardlab.cli.render import (
    emit_json,
    out,
    timing_source,
)
from shardlab.costmodel import silicon
from shardlab.problems.catalog import CATALOG, load_model
from shardlab.problems.cluster import builtin_accelerators
from shardlab.problems.problem import Problem
from shardlab.problems.workload import PRESETS


@app.command()
def models(fmt: FormatOpt = Format.table) -> None:
    """List the built-in models: parameters as their cards count them (total, and
    active per token with and without the input embedding) and their layer kinds."""
    rows = []
    for entry in CATALOG:
        m = load_model(entry.name)
        p = m.num_params()
        spans = Counter(a.short() for a in m.attention_layers)
        ffn = Counter(m.layer_kinds)
        softmax = "MLA" if m.mla else ("MHA" if m.num_kv_heads == m.num_heads else "GQA")
        if m.dsa is not None:
            softmax += "+DSA"
        if m.linear is not None:
            softmax += "+" + {"gated_deltanet": "GDN", "kda": "KDA"}[m.linear.kind]
        rows.append(
            {
                "name": entry.name,
                "hf_id": entry.hf_id,
                "layers": m.num_layers,
                "attention": softmax,
                "attention_layers": dict(spans),
                "ffn_layers": dict(ffn),
                "experts": f"{m.moe.num_experts} top-{m.moe.top_k}" if m.moe else "",
                "total_params": p.total,
                "active_params": p.active,
                "active_params_without_embedding": p.active_compute,
                "mtp_params": p.mtp,
                "weight_dtype": m.weight_dtype,
                "note": entry.note,
            }
        )
    if fmt is Format.json:
        emit_json(rows)
        return
    table = Table(title="Built-in models")
    cols = ("name", "layers", "attention", "experts", "params", "active", "w/o emb.", "dtype")
    for col in (*cols, "note"):
        right = col in ("layers", "params", "active", "w/o emb.")
        table.add_column(col, justify="right" if right else "left")
    for r in rows:
        kinds = " + ".join(f"{n} {k}" for k, n in r["attention_layers"].items())
        if len(r["ffn_layers"]) > 1:
            kinds += "; " + " + ".join(f"{n} {k}" for k, n in r["ffn_layers"].items())
        table.add_row(
            r["name"],
            str(r["layers"]),
            r["attention"]
            if len(r["attention_layers"]) == 1 and len(r["ffn_layers"]) == 1
            else f"{r['attention']}: {kinds}",
            r["experts"],
            f"{r['total_params'] / 1e9:,.1f}B",
            f"{r['active_params'] / 1e9:,.1f}B",
            f"{r['active_params_without_embedding'] / 1e9:,.1f}B",
            r["weight_dtype"],
            r["note"],
        )
    out.print(table)


@app.command()
def clusters(fmt: FormatOpt = Format.table) -> None:
    """List the built-in GPUs (write a cluster as GPUxCOUNT, e.g. h100x64)."""
    accs = builtin_accelerators()
    if fmt is Format.json:
        emit_json(
            [
                {
                    "key": k,
                    **{f: getattr(a, f) for f in a.__dataclass_fields__},
                    "timing": timing_source(k),
                    "measured_engines": silicon.measured_engines(k),
                }
                for k, a in accs.items()
            ]
        )
        return
    table = Table(title="Built-in GPUs (per GPU; bandwidths one way)")
    cols = (
        "key",
        "name",
        "BF16 TF/s",
        "FP8 TF/s",
        "FP4 TF/s",
        "mem GB",
        "mem GB/s",
        "scale-up GB/s",
        "net GB/s",
        "host",
        "domain",
        "timing",
    )
    for col in cols:
        left = col in ("key", "name", "timing")
        table.add_column(col, justify="left" if left else "right")
    for key, a in accs.items():
        table.add_row(
            key,
            a.name,
            f"{a.bf16_tflops:g}",
            f"{a.fp8_tflops:g}" if a.fp8_tflops else "-",
            f"{a.fp4_tflops:g}" if a.fp4_tflops else "-",
            f"{a.hbm_gb:g}",
            f"{a.hbm_gbps:g}",
            f"{a.nvlink_gbps:g}",
            f"{a.net_gbps:g}",
            str(a.gpus_per_node),
            str(a.gpus_per_domain),
            timing_source(key),
        )
    out.print(table)
    versions: dict[str, list[str]] = {}
    for k in accs:
        if silicon.covers(k):
            named = ", ".join(f"{e} {v}" for e, v in silicon.measured_engines(k).items())
            versions.setdefault(named, []).append(k)
    out.print(
        "host: GPUs one server (one pod) holds; domain: GPUs on one NVLink fabric (xGMI on "
        "AMD, PCIe on cards without either), where collectives run at the scale-up rate.\n"
        "timing: silicon = aiconfigurator-core's measured kernels ("
        + "; ".join(f"{', '.join(keys)}: {named}" for named, keys in versions.items())
        + "); roofline = the peaks and bandwidths above, no measured kernels; "
        "roofline-calibrated = the roofline with efficiencies fitted to public measured "
        "runs (shardlab/data/calibrations/), still no measured kernels."
    )


@app.command()
def workloads(fmt: FormatOpt = Format.table) -> None:
    """List the workload presets."""
    if fmt is Format.json:
        emit_json([asdict(w) for w in PRESETS.values()])
        return
    table = Table(title="Workload presets")
    table.add_column("name")
    table.add_column("description")
    for w in PRESETS.values():
        table.add_row(w.name, w.describe())
    out.print(table)


@app.command()
@problem_command
def space(problem: Problem, fmt: FormatOpt = Format.table) -> None:
    """Size of the search space: degree tuples, variables, plans."""
    s = problem.space
    p = problem.model.num_params()
    other_tie = "layer" if problem.tie == "kind" else "kind"
    sizes: dict[str, float | None] = {problem.tie: s.log10_size(), other_tie: None}
    if s.configs is None:  # an engine chooses options per model only
        other = Problem.build(problem.model, problem.cluster, problem.workload, tie=other_tie)
        sizes[other_tie] = other.space.log10_size()
    data = {
        "model": problem.model.name,
        "cluster": problem.cluster.name,
        "space": problem.space_kind,
        "tie": problem.tie,
        "total_params": p.total,
        "active_params": p.active,
        "weight_gb": problem.weight_bytes() / 1e9,
        "num_degree_tuples": s.num_degree_tuples,
        "num_variables": s.n_vars,
        "log10_space_size": sizes[problem.tie],
        "log10_space_size_per_kind": sizes["kind"],
        "log10_space_size_per_layer": sizes["layer"],
        "degree_tuples": [asdict(d) for d in s.degree_tuples],
    }
    if s.configs is not None:
        data["engine"] = f"{problem.engine} {s.capability.version}"  # type: ignore[union-attr]
        data["features"] = [list(c.features) for c in s.configs]
    if fmt is Format.json:
        emit_json(data)
        return
    out.print(f"[bold]{problem.model.name}[/] on {problem.cluster.describe()}")
    out.print(
        f"  parameters: {p.total / 1e9:,.1f}B total, {p.active / 1e9:,.1f}B active per token; "
        f"weights {data['weight_gb']:,.0f} GB"
    )
    if s.configs is not None:
        out.print(
            f"  {data['engine']} configurations (degrees + engine features): "
            f"{s.num_degree_tuples} over {len(set(s.degree_tuples))} degree tuples",
            markup=False,
        )
    else:
        out.print(f"  degree tuples: {s.num_degree_tuples}")
    out.print(f"  variables ({problem.tie}): {s.n_vars}")
    out.print(f"  plans, options tied per layer kind: 10^{sizes['kind']:.1f}")
    if sizes["layer"] is not None:
        out.print(f"  plans, options chosen per layer:    10^{sizes['layer']:.1f}")


@app.command()
def engines(fmt: FormatOpt = Format.table) -> None:
    """What each engine can launch: its pinned version and features, with sources."""
    from shardlab.problems.engines import ENGINES, capability, option_coverage

    rows = []
    for name in ENGINES:
        cap = capability(name)
        rows.append(
            {
                "engine": name,
                "version": cap.version,
                "uneven_pipeline_stages": cap.uneven_pp,
                "features": [
                    {"name": f.name, "turns_on": f.turns_on, "source": f.source, "doc": f.doc}
                    for f in cap.features
                ],
            }
        )
    coverage = {name: option_coverage(name) for name in ENGINES}
    pairs = list(dict.fromkeys(k for c in coverage.values() for k in c))
    for r in rows:
        r["options"] = [
            {"operator": op, "option": opt, "features": coverage[r["engine"]][(op, opt)]}
            for op, opt in pairs
        ]
    if fmt is Format.json:
        emit_json(rows)
        return
    table = Table(title="Engines (--space engine, shardlab launch)")
    for col in ("engine", "feature", "turned on by", "what it does", "source"):
        table.add_column(col, overflow="fold")
    for r in rows:
        for f in r["features"]:
            table.add_row(
                f"{r['engine']} {r['version']}", f["name"], f["turns_on"], f["doc"], f["source"]
            )
    out.print(table)
    options = Table(
        title="Operator options each engine runs (with the fewest features it takes; "
        "'-': no equivalent)"
    )
    for col in ("operator", "option", *ENGINES):
        options.add_column(col)
    for op, opt in pairs:
        cells = []
        for name in ENGINES:
            feats = coverage[name][(op, opt)]
            cells.append("-" if feats is None else "+".join(feats) or "default")
        options.add_row(op, opt, *cells)
    out.print(options)


@app.command()
def solvers(fmt: FormatOpt = Format.table) -> None:
    """List the registered methods."""
    from shardlab.solvers.registry import available_solvers, solver_class

    rows = []
    for name in available_solvers():
        try:
            cls = solver_class(name)
            rows.append(
                {
                    "name": name,
                    "exact": cls.exact,
                    "description": cls.description,
                    "available": True,
                }
            )
        except ImportError as exc:  # an optional dependency is missing
            rows.append({"name": name, "exact": False, "description": str(exc), "available": False})
    if fmt is Format.json:
        emit_json(rows)
        return
    table = Table(title="Methods")
    for col in ("name", "exact", "description"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], "yes" if r["exact"] else "", r["description"])
    out.print(table)
