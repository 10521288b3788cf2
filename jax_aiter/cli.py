"""The ``jax-aiter`` command: ``info`` (which implementation each op takes here), ``demo`` (train the tiny
Llama-style model on the CPU or GPU), ``bench`` (every op against plain JAX and cuDNN, docs/performance.md),
``convergence`` (the same model with BF16 vs each MXFP4 recipe) and
``check-aiter`` (an AITER tree's GEMM code objects and tables against the bridge's argument blocks)."""

from __future__ import annotations

import argparse
import math
import sys
import time


def _progress(total: int, width: int = 30):
    start = time.perf_counter()

    def show(step: int, loss: float) -> None:
        done = step + 1
        filled = int(width * done / total)
        elapsed = time.perf_counter() - start
        sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] step {done}/{total}  loss {loss:.4f}  "
                         f"{elapsed:5.1f}s")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


def _at_least(minimum: int):
    """An argparse type: an int >= minimum, else a usage error naming the bound."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def cmd_info(args: argparse.Namespace) -> int:
    import jax_aiter

    print(jax_aiter.info())
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    import jax_aiter
    from jax_aiter.examples import tiny_llama

    try:
        import jax_aiter.mha  # noqa: F401  (the demo's attention)
    except ModuleNotFoundError as err:
        print(f"jax-aiter demo needs attention: {err}", file=sys.stderr)
        return 1
    cfg = tiny_llama.Config(steps=args.steps, seed=args.seed)
    print(jax_aiter.info())
    built = ("Flax NNX layers (jax_aiter.flax)" if tiny_llama.HAS_FLAX
             else "functional ops (Flax is not installed: pip install 'jax-aiter[flax]' for the layers)")
    print(f"\nTraining a {cfg.layers}-layer Llama-style decoder (dim {cfg.dim}, {cfg.heads} query / {cfg.kv_heads} "
          f"KV heads) on arithmetic sequences, vocab {cfg.vocab}, {cfg.steps} steps of batch {cfg.batch}; "
          f"model built from {built}.")
    losses = tiny_llama.train(cfg, on_step=_progress(cfg.steps))
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    print(f"loss: first steps {first:.3f} (chance {math.log(cfg.vocab):.3f}) -> last steps {last:.3f}")
    if not last < 0.5 * first:
        print("loss did not fall by half: something is wrong", file=sys.stderr)
        return 1
    return 0


def cmd_convergence(args: argparse.Namespace) -> int:
    from pathlib import Path

    from jax_aiter.examples import convergence, tiny_llama

    unknown = [name for name in args.recipes or () if name not in convergence.RECIPES]
    if unknown:
        print(f"jax-aiter convergence: unknown recipe(s) {', '.join(unknown)}; known: "
              f"{', '.join(convergence.RECIPES)}", file=sys.stderr)
        return 2
    cfg = tiny_llama.Config(steps=args.steps, seed=args.seed)
    recipes = args.recipes or list(convergence.RECIPES)
    total = cfg.steps
    bars = {}

    def on_step(name: str, step: int, loss: float) -> None:
        if name not in bars:
            print(f"{name}:", file=sys.stderr)
            bars[name] = _progress(total)
        bars[name](step, loss)

    results = convergence.run(cfg, recipes, on_step)
    print(f"{'run':<20} {'final loss':>10} {'gap / BF16 progress':>20}")
    for name, row in convergence.summary(results)["runs"].items():
        print(f"{name:<20} {row['final_loss']:>10.4f} {row['relative_gap']:>20.3%}")
    for path in convergence.save(results, cfg, Path(args.out)):
        print(f"wrote {path}")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from jax_aiter import benchmark

    return benchmark.main(args.bench_args)


def cmd_check_aiter(args: argparse.Namespace) -> int:
    import shutil
    from pathlib import Path

    from jax_aiter.aiter import validate

    if args.no_disassembly:
        objdump, without = None, "--no-disassembly"
    elif args.objdump:
        objdump, without = shutil.which(args.objdump), None
        if objdump is None:
            print(f"check-aiter: --objdump {args.objdump}: no such executable", file=sys.stderr)
            return 2
    else:
        objdump, without = validate.find_objdump(), "no llvm-objdump found"
    try:
        problems = validate.check_tree(Path(args.path), objdump)
    except validate.ArtifactError as err:
        print(f"check-aiter: {err}")
        return 1
    for problem in problems:
        print(problem)
    if problems:
        print(f"check-aiter: {len(problems)} problem{'s' if len(problems) > 1 else ''}", file=sys.stderr)
        return 1
    loads = f"with kernarg loads ({objdump})" if objdump else f"without disassembly ({without})"
    print(f"check-aiter: no problems in {args.path} {loads}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jax-aiter", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="per op and platform, the implementation a call takes here and why").set_defaults(
        run=cmd_info)
    demo = sub.add_parser("demo", help="train a tiny Llama-style decoder built from jax_aiter ops")
    # The demo compares the mean loss of the first and the last five steps.
    demo.add_argument("--steps", type=_at_least(10), default=150)
    demo.add_argument("--seed", type=int, default=0)
    demo.set_defaults(run=cmd_demo)
    conv = sub.add_parser("convergence", help="train the demo model with BF16 and each MXFP4 recipe, compare losses")
    conv.add_argument("--steps", type=_at_least(1), default=150)
    conv.add_argument("--seed", type=int, default=0)
    conv.add_argument("--recipes", nargs="*", help="recipe names (default: all)")
    conv.add_argument("--out", default="convergence-out", help="directory for convergence.json and .png")
    conv.set_defaults(run=cmd_convergence)
    bench = sub.add_parser("bench", add_help=False,
                           help="every op against plain JAX / cuDNN in one process: table, JSON and plot "
                                "(jax-aiter bench --help for its options)")
    bench.add_argument("bench_args", nargs=argparse.REMAINDER)
    bench.set_defaults(run=cmd_bench)
    check = sub.add_parser("check-aiter", help="check an AITER checkout's GEMM code objects and kernel tables "
                           "against the bridge's argument blocks and table schema")
    check.add_argument("path", help="AITER checkout, its hsa/ folder or an installed stage")
    check.add_argument("--objdump", metavar="PATH", help="the llvm-objdump that disassembles the kernels for the "
                       "kernarg-load checks: LLVM 17+ for gfx942, 20+ for gfx950, or ROCm's (default: ROCm's, "
                       "else the one on PATH)")
    check.add_argument("--no-disassembly", action="store_true", help="skip the kernarg-load checks")
    check.set_defaults(run=cmd_check_aiter)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # the benchmark parses its own options (jax-aiter bench --help)
        return cmd_bench(argparse.Namespace(bench_args=argv[1:]))
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
