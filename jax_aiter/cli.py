"""The ``jax-aiter`` command: ``info`` (which implementation each op takes here), ``demo`` (train the tiny
Llama-style model on the CPU or GPU), ``bench`` (every op against plain JAX and cuDNN, docs/performance.md),
``convergence`` (the same model on real text once per precision policy, compared with BF16),
``check-aiter`` (an AITER tree's GEMM code objects and tables against the bridge's argument blocks) and ``recipe``
(a MaxText recipe run with jax-aiter's ops, docs/recipes/mxfp4_llama3_8b_maxtext.md)."""

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


def _training_bar(label: str, total: int):
    """``on_step(step, loss, held_out, seconds)`` drawing a tqdm bar when tqdm is installed, else one status line
    on stderr (redrawn every step on a terminal, printed at each evaluation otherwise)."""
    try:
        from tqdm import tqdm
    except ModuleNotFoundError:
        tqdm = None
    bar = tqdm(total=total, desc=label, unit="step", file=sys.stderr) if tqdm else None
    start = time.perf_counter()
    state = {"held_out": math.nan}

    def show(step: int, loss: float, held_out: float | None, seconds: float) -> None:
        done = step + 1
        if held_out is not None:
            state["held_out"] = held_out
        fields = f"loss {loss:.4f}  held-out {state['held_out']:.4f}  {1e3 * seconds:.1f} ms/step"
        if bar is not None:
            bar.set_postfix_str(fields, refresh=False)
            bar.update(1)
            if done == total:
                bar.close()
            return
        line = f"{label}: step {done}/{total}  {fields}  {time.perf_counter() - start:.0f} s"
        if sys.stderr.isatty():
            sys.stderr.write(f"\r{line}" + ("\n" if done == total else ""))
        elif held_out is not None:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    return show


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:+.2f} %"


def cmd_convergence(args: argparse.Namespace) -> int:
    import dataclasses
    from pathlib import Path

    from jax_aiter.examples import convergence, models

    def fail(message: str) -> int:
        print(f"jax-aiter convergence: {message}", file=sys.stderr)
        return 2

    if args.list_arms:
        width = max(map(len, convergence.ARMS))
        for name, arm in convergence.ARMS.items():
            print(f"{name:<{width}}  {arm.description}")
        return 0
    if args.merge_from and args.arms:
        return fail("--merge-from merges arms trained elsewhere; --arms names arms to train: give one of them")
    arms = [] if args.merge_from else args.arms or list(convergence.DEFAULT_ARMS)
    unknown = [name for name in arms if name not in convergence.ARMS]
    if unknown:
        return fail(f"unknown arm(s) {', '.join(unknown)}; known: {', '.join(convergence.ARMS)}")
    if len(set(arms)) != len(arms):
        return fail(f"an arm is named twice in --arms {' '.join(arms)}")
    if args.seed is not None and len(set(args.seed)) != len(args.seed):
        return fail(f"a seed is named twice in --seed {' '.join(map(str, args.seed))}")
    overrides = {name: value for name, value in vars(args).items()
                 if name in convergence.OVERRIDES and name != "seed" and value is not None}
    try:
        setup = convergence.Setup.for_model(args.model, **overrides)
    except ValueError as err:
        return fail(str(err))
    cfg = setup.config
    for name in arms:
        try:
            convergence.ARMS[name].final_from(cfg.steps)
        except ValueError as err:
            return fail(f"arm {name}: {err}")
    if args.lower_only:
        count = models.parameter_count(cfg)
        for name in arms:
            lowered = convergence.lower_step(setup, convergence.ARMS[name].policy)
            print(f"{args.model} / {name}: training step lowered ({count / 1e6:.1f} M parameters, batch {cfg.batch} "
                  f"x {cfg.seq_len}; {len(lowered.as_text()) / 1e6:.1f} M characters of StableHLO)")
        return 0
    if args.paired_to is not None and (args.seed is None or len(args.seed) < 2):
        return fail("--paired-to compares arms over seeds: give two seeds or more with --seed")
    if not models.MODELS[args.model].trainable:
        return fail(f"model {args.model} is a shape to lower (--lower-only), not to train here")
    if args.data is None and args.model != "cpu-tiny":
        return fail(f"--data is required for model {args.model} (the bundled sample is for cpu-tiny)")
    try:
        data_path = args.data if args.data is not None else convergence.bundled_sample()
        setup, data = convergence.load_data(setup, data_path, kind=args.data_kind, vocab_size=args.vocab_size)
    except (OSError, ValueError) as err:
        return fail(str(err))
    cfg, corpus = setup.config, data.corpus
    # The seed changes only the weights, the data order and the rounding keys: one corpus serves every seed.
    seeds = args.seed or [cfg.seed]
    setups = [dataclasses.replace(setup, config=dataclasses.replace(cfg, seed=seed)) for seed in seeds]
    out = Path(args.out)
    # One seed writes into --out itself; several write one directory each (seed-<S>) and a summary over seeds.
    outs = [out] if len(seeds) == 1 else [out / convergence.seed_directory(seed) for seed in seeds]
    runs = []
    for setup, run_out in zip(setups, outs, strict=True):
        try:
            results = convergence.merge(convergence.load_results(run_out), setup, data.corpus)
        except convergence.SetupMismatch as err:
            return fail(f"--out {run_out}: {err}")
        if args.max_gap is not None and not args.merge_from and convergence.REFERENCE not in arms \
                and convergence.REFERENCE not in results["arms"]:
            return fail(f"--max-gap needs the {convergence.REFERENCE} arm, in --arms or already in {run_out}")
        runs.append((setup, run_out, results))
    if len(runs) > 1:
        try:
            earlier = convergence.seed_tables(out, setup, data.corpus)  # earlier calls' seeds join the summary
        except convergence.SetupMismatch as err:
            return fail(f"--out {out}: {err}")
        if args.paired_to is not None and not args.merge_from and args.paired_to not in arms \
                and not any(args.paired_to in table for table in earlier.values()):
            return fail(f"--paired-to {args.paired_to}: the arm is neither in --arms nor in a seed directory of {out}")
    print(f"{args.model}: {models.parameter_count(cfg) / 1e6:.1f} M parameters ({cfg.layers} layers, dim {cfg.dim}, "
          f"{cfg.heads} query / {cfg.kv_heads} KV heads, SwiGLU {cfg.mlp_dim}, vocab {cfg.vocab}); batch {cfg.batch} x "
          f"{cfg.seq_len}, {cfg.steps} steps, warm-up {setup.warmup_steps}, peak lr {cfg.learning_rate:g}")
    print(f"corpus {corpus['name']} (sha256 {corpus['sha256'][:16]}…, {corpus['tokens']} tokens): "
          f"{corpus['epoch_fraction']:.2f} epoch of its training split; held-out loss every {setup.eval_every} steps "
          f"on {setup.eval_batches} batches")
    if args.merge_from:
        merged, logs = [], []  # every seed's merge is checked before anything is written
        for setup, run_out, results in runs:
            # With several seeds a source contributes its seed-<S> directory, where it has one.
            sources = [Path(d) if len(runs) == 1 else Path(d) / convergence.seed_directory(setup.config.seed)
                       for d in args.merge_from]
            sources = [d for d in sources if len(runs) == 1 or (d / "convergence.json").exists()]
            if not sources:
                return fail(f"--merge-from: no directory holds {convergence.seed_directory(setup.config.seed)}")
            for source in sources:
                try:
                    results, names = convergence.merge_directory(results, setup, data.corpus, source)
                except (OSError, convergence.SetupMismatch) as err:
                    return fail(f"--merge-from {source}: {err}")
                logs.append((source, run_out, names))
                label = "" if len(runs) == 1 else f"seed {setup.config.seed} "
                print(f"{label}merged {', '.join(names) or 'nothing new'} from {source}")
            if args.max_gap is not None and convergence.REFERENCE not in results["arms"]:
                return fail(f"--max-gap needs the {convergence.REFERENCE} arm; neither {run_out} nor --merge-from "
                            "holds it")
            merged.append((setup, run_out, results))
        runs = merged
        for source, run_out, names in logs:
            convergence.copy_mllogs(source, run_out, names)
    for setup, run_out, results in runs:
        label = "" if len(runs) == 1 else f"seed {setup.config.seed} "
        if args.merge_from:
            written = convergence.save(results, run_out)
        for name in arms:
            log = convergence.open_mllog(run_out, name)
            if log is None and name == arms[0] and run_out == outs[0]:
                print("mlperf-logging is not installed (pip install 'jax-aiter[convergence]'): no MLPerf log",
                      file=sys.stderr)
            record = convergence.train_arm(setup, data, name, convergence.ARMS[name],
                                           on_step=_training_bar(label + name, setup.config.steps), log=log)
            try:
                results = convergence.merge(results, setup, data.corpus, name, record)
            except convergence.SetupMismatch as err:
                return fail(f"arm {name}: {err}")
            written = convergence.save(results, run_out)  # after every arm, so a cut-off run keeps the finished arms
        table = convergence.gaps(results)
        print(f"\n{label or 'arm':<34} {'held-out':>9} {'gap':>9} {'train':>8} {'gap':>9} {'ms/step':>9} "
              f"{'vs bf16':>8}")
        for name, row in table.items():
            ratio = "—" if row["step_time_ratio"] is None else f"{row['step_time_ratio']:.2f}"
            print(f"{name:<34} {row['held_out']:>9.4f} {_percent(row['held_out_gap']):>9} {row['train']:>8.4f} "
                  f"{_percent(row['train_gap']):>9} {row['step_time_ms']:>9.1f} {ratio:>8}")
        for path in written:
            print(f"wrote {path}")
        if not any(path.suffix == ".png" for path in written):
            print("matplotlib is not installed (pip install 'jax-aiter[convergence]'): no convergence.png",
                  file=sys.stderr)
    print(convergence.GAP_DEFINITION)
    if len(runs) == 1:
        gate = {name: row["held_out_gap"] for name, row in table.items()}
    else:
        try:
            summary = convergence.seed_summary(convergence.seed_tables(out, setup, data.corpus), args.paired_to)
        except ValueError as err:  # --paired-to an arm that --merge-from did not bring
            return fail(str(err))
        path = convergence.save_seed_summary(summary, out)
        paired_header = "" if args.paired_to is None else f"  minus {args.paired_to}, paired (± std err)"
        print(f"\n{'over seeds ' + ' '.join(map(str, summary['seeds'])):<34} {'mean gap':>9} {'std':>8} "
              f"{'std err':>8} {'min':>9} {'max':>9}{paired_header}")
        for name, row in summary["arms"].items():
            difference = row.get("paired")
            seeds = " ".join(map(str, difference["seeds"])) if difference else ""
            paired = "" if difference is None else (
                f"  {_percent(difference['held_out_gap_difference_mean'])} ± "
                f"{100 * difference['held_out_gap_difference_stderr']:.2f} (seeds {seeds})")
            print(f"{name:<34} {_percent(row['held_out_gap_mean']):>9} {100 * row['held_out_gap_std']:>7.2f}  "
                  f"{100 * row['held_out_gap_stderr']:>7.2f}  {_percent(row['held_out_gap_min']):>9} "
                  f"{_percent(row['held_out_gap_max']):>9}{paired}")
        print(convergence.SEED_SUMMARY_DEFINITION)
        print(f"wrote {path}")
        gate = {name: row["held_out_gap_mean"] for name, row in summary["arms"].items()}
    if args.max_gap is None:
        return 0
    # A NaN gap (a diverged arm) fails too: it is not <= the threshold.
    what = "held-out gap" if len(runs) == 1 else "mean held-out gap over seeds"
    failing = [name for name, gap in gate.items()
               if name != convergence.REFERENCE and not 100 * gap <= args.max_gap]
    if failing:
        print(f"{what} above {args.max_gap} %: {', '.join(failing)}", file=sys.stderr)
        return 1
    print(f"every arm's {what} is at most {args.max_gap} %")
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


def cmd_recipe(args: argparse.Namespace) -> int:
    from jax_aiter.maxtext import recipe_command

    return recipe_command(args)


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
    conv = sub.add_parser("convergence", help="train a Llama-style decoder on real text once per precision arm "
                          "(BF16, FP8, MXFP4 policies) from the same weights and data, compare held-out losses "
                          "(docs/convergence.md)")
    conv.add_argument("--model", default="cpu-tiny",
                      help="model shape with its default batch, sequence length, steps and learning rate: "
                      "cpu-tiny (default), 75m, 350m, llama3.1-8b (--lower-only)")
    conv.add_argument("--arms", nargs="+", metavar="ARM",
                      help="precision arms to train (default: bf16 fp8 mxfp4 mxfp4-all; --list-arms lists them)")
    conv.add_argument("--list-arms", action="store_true", help="list the arms and exit")
    conv.add_argument("--data", help="corpus: a text file or folder, a token file, or a Megatron .bin/.idx prefix "
                      "(default for cpu-tiny: the real-text sample shipped with the package)")
    conv.add_argument("--data-kind", default="auto", choices=["auto", "bytes", "uint16", "uint32", "megatron"])
    conv.add_argument("--vocab-size", type=_at_least(1), help="the token corpus's vocabulary size")
    conv.add_argument("--steps", type=_at_least(1))
    conv.add_argument("--eval-every", type=_at_least(1), help="held-out evaluation period in steps")
    conv.add_argument("--eval-batches", type=_at_least(1), help="number of fixed held-out batches")
    conv.add_argument("--batch", type=_at_least(1))
    conv.add_argument("--seq-len", type=_at_least(1))
    conv.add_argument("--learning-rate", type=float, help="peak learning rate")
    conv.add_argument("--warmup-steps", type=_at_least(0))
    conv.add_argument("--seed", type=int, nargs="+", metavar="S",
                      help="initial weights, data order and stochastic rounding (default 0); several seeds train "
                      "every arm once per seed, each into DIR/seed-<S>, and summarize the paired gaps over seeds")
    conv.add_argument("--max-gap", type=float, metavar="PCT",
                      help="exit 1 when a non-BF16 arm's held-out gap to BF16 (with several seeds: its mean over "
                      "the seeds) exceeds PCT percent")
    conv.add_argument("--paired-to", metavar="ARM",
                      help="with several seeds: also give every arm's held-out gap minus ARM's, seed by seed, with "
                      "its mean and standard error (ARM trained in this call or an earlier one)")
    conv.add_argument("--merge-from", nargs="+", metavar="DIR",
                      help="train nothing: merge the arms of results directories written by other processes or "
                      "machines with the same setup (with --seed, each DIR's seed-<S> directories) into --out, then "
                      "print the table and, with several seeds, the summary")
    conv.add_argument("--lower-only", action="store_true",
                      help="only lower each arm's training step (abstract shapes, nothing trained)")
    conv.add_argument("--out", default="convergence-out",
                      help="directory for convergence.json, convergence.png and mllog/; arms merge into an "
                      "existing convergence.json of the same setup")
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
    from jax_aiter.maxtext import MODES, RECIPES  # imports neither jax nor MaxText

    recipe = sub.add_parser("recipe", help="resolve or run a MaxText recipe with jax-aiter's GEMMs and attention "
                            "(docs/recipes/mxfp4_llama3_8b_maxtext.md)")
    recipe.add_argument("recipe", choices=list(RECIPES))
    recipe.add_argument("--mode", required=True, choices=list(MODES))
    recipe.add_argument("--out", required=True, help="output directory (must not exist or be empty)")
    recipe.add_argument("--steps", type=_at_least(1), help="training steps (default: the recipe's)")
    recipe.add_argument("--data", help="training set: a Megatron .bin/.idx prefix (default: synthetic)")
    recipe.add_argument("--eval-data", help="held-out set: a Megatron .bin/.idx prefix (with --data)")
    recipe.add_argument("--eod-id", type=_at_least(0), help="end-of-document token id of --data's preprocessing")
    recipe.add_argument("--dump-hlo", action="store_true", help="dump the training step's HLO to OUT/hlo")
    recipe.add_argument("--set", action="append", metavar="KEY=VALUE", help="a MaxText override (repeatable)")
    recipe.add_argument("--final-mode", choices=list(MODES),
                        help="a closing phase: the last steps in this mode, resumed from a checkpoint "
                        "(jax_aiter.precision.PrecisionSchedule)")
    recipe.add_argument("--final-fraction", type=float, metavar="F",
                        help="the closing phase's fraction of the steps (with --final-mode; default 0.25)")
    recipe.add_argument("--dry-run", action="store_true",
                        help="print the resolved MaxText arguments, XLA flags and environment; import no jax")
    recipe.set_defaults(run=cmd_recipe)
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # the benchmark parses its own options (jax-aiter bench --help)
        return cmd_bench(argparse.Namespace(bench_args=argv[1:]))
    args = parser.parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
