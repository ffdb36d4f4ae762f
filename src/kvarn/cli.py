"""The `kvarn` command line: `kvarn demo`, `kvarn info` and `kvarn eval` (which needs the eval extra: without it,
it stops with an error naming the extra)."""
from __future__ import annotations

import argparse
import os
import sys

from . import __version__
from ._ops import MAX_THREADS  # the package's __init__ has loaded _ops already (python -m kvarn imports it)


def int_at_least(minimum: int, maximum: int | None = None):
    """An argparse type: an int in [minimum, maximum] (argparse names the option in its error)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum}, got {value}")
        return value
    return parse


def _cmd_demo(args) -> int:
    from . import set_num_threads
    from .demo import run_demo

    if args.threads is not None:
        set_num_threads(args.threads)
    run_demo(preset=args.preset, synthetic=args.synthetic, max_queries=args.queries, repeats=args.repeats)
    return 0


def _cmd_info(args) -> int:
    import kvarn
    from kvarn import _native

    print(f"kvarn {kvarn.__version__}")
    print(f"ISAs available: {', '.join(kvarn.available_isas())}; active: {kvarn.active_isa()}")
    print(f"threads: {kvarn.get_num_threads()}")
    mode = kvarn.score_mode()
    why = {"float": "exact fp32", "int16": "int16-rounded query and weights, exact int32 sums",
           "int8": "int8-rounded query on centred 4-bit key codes, uint8-rounded 2-bit value weights, "
                   "exact int32 sums"}[mode]
    print(f"arithmetic (KVARN_SCORES): {mode} ({why}; the integer modes need AVX2, int8 on avx512 also VNNI)")
    if mode == "int16":
        print(f"int16 dot products: {'vpdpwssd (VNNI)' if _native.vnni() else 'vpmaddwd + vpaddd (no VNNI here)'}")
    elif mode == "int8":
        print(f"int8 dot products: {'vpdpbusd (VNNI)' if _native.vnni() else 'vpmaddubsw + vpaddw (no VNNI here)'}")
    if mode != "float" and kvarn.active_isa() == "avx512":
        print(f"2-bit value codes' layout: {'vpermb / vpermt2b (VBMI)' if _native.vbmi() else 'inserts + vpermd + vpshufb'}")
    from . import cuda  # always importable; the compiled module and a GPU are optional

    print(f"CUDA: {'available' if cuda.is_available() else 'unavailable (' + cuda.unavailable_reason() + ')'}")
    for name, p in kvarn.PRESETS.items():
        print(f"preset {name}: k{p.kbits} v{p.vbits} G={p.group}, {p.record_bytes(128)} B/record at D=128, "
              f"{p.bits_per_element(128):.3f} bits/element")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvarn", description="KVarN KV-cache quantisation")
    parser.add_argument("--version", action="version", version=f"kvarn {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="compress a KV sample and compare with fp16, KIVI and numpy attention")
    demo.add_argument("--preset", default="k4v2_g128")
    demo.add_argument("--synthetic", action="store_true", help="use the synthetic sample even if a real one ships")
    demo.add_argument("--queries", type=int_at_least(1, 2**31 - 1), default=8, help="query positions per layer for the error")
    demo.add_argument("--repeats", type=int_at_least(1, 2**31 - 1), default=21, help="timed runs per measurement (median)")
    demo.add_argument("--threads", type=int_at_least(0, MAX_THREADS), default=None,
                      help="native threads (default, 0: all cores)")
    demo.set_defaults(func=_cmd_demo)
    info = sub.add_parser("info", help="ISAs, threads, presets, CUDA")
    info.set_defaults(func=_cmd_info)
    try:
        from .eval import add_eval_parser
    except ImportError:
        pass
    else:
        add_eval_parser(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # The reader left (`kvarn demo | head`): stop quietly, as Unix tools do; point stdout at
        # devnull so the interpreter's final flush does not raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141  # 128 + SIGPIPE, what a shell reports for a tool killed by the signal
    except (ValueError, TypeError, RuntimeError, OSError) as exc:  # OSError: e.g. a model file that cannot be read
        print(f"kvarn: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
