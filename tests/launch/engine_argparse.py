"""Parse launch commands with an engine's own argument parser (run under a Python that
has the engine installed; tests/launch/test_launch.py calls it when one is configured).

Usage: python engine_argparse.py vllm|sglang < commands.json
Reads a JSON list of argv lists, prints a JSON list of the parsed degrees.
"""

from __future__ import annotations

import argparse
import json
import sys


def vllm_parser() -> argparse.ArgumentParser:
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()  # no GPU here: the defaults need a device
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser())


def main() -> None:
    engine = sys.argv[1]
    commands = json.load(sys.stdin)
    out = []
    if engine == "vllm":
        parser = vllm_parser()
        for argv in commands:
            i = argv.index("serve")
            args = parser.parse_args(["--model", argv[i + 1], *argv[i + 2 :]])
            out.append(
                {
                    "tp": args.tensor_parallel_size,
                    "pp": args.pipeline_parallel_size,
                    "dp": args.data_parallel_size,
                    "ep": bool(args.enable_expert_parallel),
                    "all2all": args.all2all_backend,
                    "nnodes": args.nnodes,
                    "node_rank": args.node_rank,
                }
            )
    elif engine == "sglang":
        from sglang.srt.server_args import ServerArgs

        parser = argparse.ArgumentParser()
        ServerArgs.add_cli_args(parser)
        for argv in commands:
            i = argv.index("sglang.launch_server")
            args = parser.parse_args(argv[i + 1 :])
            out.append(
                {
                    "tp": args.tp_size,
                    "pp": args.pp_size,
                    "dp": args.dp_size,
                    "ep": args.ep_size,
                    "dp_attention": args.enable_dp_attention,
                    "a2a": args.moe_a2a_backend,
                    "nnodes": args.nnodes,
                    "node_rank": args.node_rank,
                }
            )
    else:
        raise SystemExit(f"no parser for {engine}")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
