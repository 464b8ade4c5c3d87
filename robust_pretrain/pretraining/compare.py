"""Train several weighting strategies on the same data, seeds and step budget, and compare per-task held-out loss.

    robust-pretrain-compare --config recipes/configs/demo.yaml --strategies average minimax \\
        --seeds 42 43 --output_dir outputs/compare [--sweep alpha=0.5,1,2] [-- --max_steps 300 ...]

Each run is a pre-training recipe (``python -m robust_pretrain.pretraining.<recipe>``: ``pos_mlm``, or ``multimae``
for image modalities; ``--recipe``, by default the one whose options the ``--config`` file sets) in its own process
(prefix it with ``--launcher "accelerate launch --num_processes 2 ..."`` for several processes), written to
``<output_dir>/<run>/seed-<seed>``; a finished run made with the same settings (options, config file, data files) is
reused and named as such, one with other settings is re-run (extended if only ``max_steps`` grew, else refused).
Options after ``--`` go to every run. Writes ``comparison.json``, ``comparison.md``, ``comparison_tasks.png``
(per-task loss, mean and worst case, with the spread across seeds) and, with ``--sweep`` (repeatable: one setting
at a time), ``frontier.png`` (worst-case against mean for every run: the trade-off frontier).

Every table and figure is given in each scale-free metric that applies (:mod:`robust_pretrain.reporting.scoring`):
the raw held-out loss, its signed ``excess`` over a reference run's held-out loss (``--reference_run DIR``, else the
``reference_run`` every run is given, after ``--`` or in the config file) and its ``regret`` against the
``--baseline`` run (``L_t / L_t(baseline)``).
"""

from __future__ import annotations

import argparse
import importlib
import json
import shlex
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import get_args, get_type_hints

from robust_pretrain.cli import ConsoleArgumentParser, UsageError, refuse, run_console
from robust_pretrain.config import OptionParser, load_config_file, parse_with_config
from robust_pretrain.options import declared, path_problem, value_problems
from robust_pretrain.pretraining.common import file_fingerprint
from robust_pretrain.reference import ReferenceRun
from robust_pretrain.reporting.aggregation import aggregate_runs, restrict_to_common_tasks
from robust_pretrain.reporting.plots import plot_comparison
from robust_pretrain.reporting.scoring import aggregate_scores, task_mismatch
from robust_pretrain.reporting.tables import comparison_markdown, scores_markdown
from robust_pretrain.reporting.task_report import TASK_REPORT_NAME
from robust_pretrain.trainer.training_args import MinimaxTrainingArguments
from robust_pretrain.weighting import WEIGHTINGS, WeightingArguments, accepted_options

RECIPES = {
    "pos_mlm": "robust_pretrain.pretraining.pos_mlm.recipe",
    "multimae": "robust_pretrain.pretraining.multimae.recipe",
}
RUN_SETTINGS_NAME = "compare_settings.json"  # beside each run's task_report.json: the settings it was made with


def parse_sweep(text: str | None) -> tuple[str | None, list[str]]:
    if text is None:
        return None, []
    name, _, values = text.partition("=")
    swept = [v for v in values.split(",") if v]
    if not name or not swept:
        raise ValueError(f"--sweep must look like setting=v1,v2,..., got {text!r}")
    return name, swept


def sweep_value_problems(name: str, value: str) -> list[str]:
    """Why a swept value of the weighting option ``name`` is not accepted (its type and its declared range)."""
    kind = get_type_hints(WeightingArguments).get(name)
    numeric = [option for option in get_args(kind) if option is not type(None)]  # an optional number: its type
    kind = numeric[0] if len(numeric) == 1 and numeric[0] in (int, float) else kind
    if kind not in (int, float):
        return value_problems(value, declared(WeightingArguments).get(name))
    try:
        number = kind(value)
    except ValueError:
        return [f"not {'an integer' if kind is int else 'a number'}"]
    return value_problems(number, declared(WeightingArguments).get(name))


def plan_runs(strategies: list[str], sweeps: list[str] | None) -> list[tuple[str, str, dict[str, str]]]:
    """(run name, strategy, extra options); each sweep applies to the strategies that take its setting (a strategy
    several sweeps apply to runs each of them, one setting at a time)."""
    parsed = [parse_sweep(sweep) for sweep in sweeps or []]
    runs = []
    for strategy in strategies:
        if strategy not in WEIGHTINGS:
            raise ValueError(f"unknown strategy {strategy!r}; choose from {sorted(WEIGHTINGS)}")
        swept = [(name, values) for name, values in parsed if name in accepted_options(strategy)]
        for name, values in swept:
            runs += [(f"{strategy}-{name}={value}", strategy, {name: value}) for value in values]
        if not swept:
            runs.append((strategy, strategy, {}))
    for name, _ in parsed:
        if not any(name in options for _, _, options in runs):
            takers = sorted(s for s in WEIGHTINGS if name in accepted_options(s))
            raise ValueError(
                f"--sweep {name!r} is a setting of none of the strategies {strategies}"
                + (f"; it applies to {takers}" if takers else "")
            )
    return runs


def recipe_options(recipe: str) -> set[str]:
    """The options a recipe parses: the fields of its ``ModelArguments`` and ``DataArguments`` and the training
    arguments."""
    module = importlib.import_module(RECIPES[recipe])
    classes = (module.ModelArguments, module.DataArguments, MinimaxTrainingArguments)
    return {f.name for cls in classes for f in fields(cls)}


def recipe_for_config(config: dict) -> str:
    """The recipe a config file is written for: the one that takes all its keys (``pos_mlm`` if both do)."""
    fitting = [name for name in RECIPES if set(config) <= recipe_options(name)]
    if not fitting:
        unknown = {name: sorted(set(config) - recipe_options(name)) for name in RECIPES}
        raise ValueError(f"no recipe takes every option of the --config file (unknown options: {unknown})")
    return fitting[0]


def planned_runs(recipe: str, options: list[str]) -> tuple[list[str], str | None]:
    """The task names the runs of ``recipe`` will have with ``options`` (the config file's included) and the
    ``reference_run`` they are given, parsed as the recipe parses them, before any run: the task spec's tasks (PoS)
    or the modalities (MM-MAE)."""
    module = importlib.import_module(RECIPES[recipe])
    parser = OptionParser((module.ModelArguments, module.DataArguments, MinimaxTrainingArguments))
    model_args, data_args, training_args = parse_with_config(parser, options)
    if recipe == "multimae":
        return module.resolve_modalities(model_args), training_args.reference_run
    from robust_pretrain.data import TaskSpec

    try:
        return TaskSpec.resolve(data_args.task_spec).task_names, training_args.reference_run
    except (OSError, ValueError) as err:
        raise UsageError(f"--task_spec: {err}") from err


def run_settings(options: list[str], cli: argparse.Namespace) -> dict:
    """What a run's result depends on: the recipe's options (those of the config file included), the launcher, and
    the content of every file an option names (data, task spec)."""
    config = load_config_file(cli.config) if cli.config else {}
    values = [*options, *(str(v) for value in config.values() for v in (value if isinstance(value, list) else [value]))]
    return {
        "config": config,
        "options": options,
        "launcher": cli.launcher,
        "files": {value: file_fingerprint(value) for value in values if Path(value).is_file()},
    }


def run_one(run_dir: Path, strategy: str, seed: int, options: dict[str, str], cli: argparse.Namespace) -> dict:
    """The run's task report: read if the run finished with the same settings (``compare_settings.json``), else
    trained (a run in ``run_dir`` with other settings is extended if only ``max_steps`` grew, else refused)."""
    report = run_dir / TASK_REPORT_NAME
    recipe_options = ["--config", cli.config] if cli.config else []
    recipe_options += ["--weighting", strategy, "--seed", str(seed)]
    for key, value in options.items():
        recipe_options += [f"--{key}", value]
    recipe_options += cli.overrides
    settings = run_settings(recipe_options, cli)
    saved = run_dir / RUN_SETTINGS_NAME
    if report.is_file() and saved.is_file() and json.loads(saved.read_text()) == settings:
        print(f"= reusing {run_dir} (finished with the same settings)", flush=True)
        return json.loads(report.read_text())
    launcher = shlex.split(cli.launcher) if cli.launcher else [sys.executable]
    command = [*launcher, "-m", RECIPES[cli.recipe], *recipe_options, "--output_dir", str(run_dir)]
    print("+", shlex.join(command), flush=True)
    try:
        subprocess.run(command, check=True)
    except subprocess.CalledProcessError as err:
        raise UsageError(
            f"the run in {run_dir} failed (exit status {err.returncode}); its message is above. Command: "
            f"{shlex.join(command)}"
        ) from err
    saved.write_text(json.dumps(settings, indent=2) + "\n")
    return json.loads(report.read_text())


def main(argv: list[str] | None = None) -> int:
    """Console entry point (``robust-pretrain-compare``): exit status 2 and one paragraph for a bad option or run."""
    return run_console(run, argv, prog="robust-pretrain-compare")


def run(argv: list[str]) -> dict:
    """Train (or reuse) every run, then write and return the comparison."""
    cli, runs = parse_arguments(argv)
    reference_run, reference = check_plan(cli, runs)
    run_names = [name for name, _, _ in runs]
    baseline = cli.baseline or ("proportional" if "proportional" in run_names else run_names[0])
    output_dir = Path(cli.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    reports: dict[str, list[dict]] = {}
    for name, strategy, options in runs:
        reports[name] = [
            run_one(output_dir / name / f"seed-{seed}", strategy, seed, options, cli) for seed in cli.seeds
        ]
    return write_comparison(reports, cli, baseline, reference_run, reference)


def build_parser() -> ConsoleArgumentParser:
    """The command line of ``robust-pretrain-compare`` (the options before ``--``)."""
    parser = ConsoleArgumentParser(
        prog="robust-pretrain-compare", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", help="config file of the pre-training recipe shared by every run")
    parser.add_argument(
        "--strategies",
        nargs="+",
        default=["proportional", "average", "minimax"],
        help="weighting strategies (default: the standard MLM objective, the eq. 4 average and minimax)",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[42], help="seeds (>= 0); each strategy runs with each")
    parser.add_argument(
        "--sweep",
        action="append",
        help="a setting over values, e.g. alpha=0.5,1,2 or loss_normalization=raw,relative (repeat for several)",
    )
    parser.add_argument("--output_dir", required=True, help="where runs and the comparison are written")
    parser.add_argument(
        "--baseline",
        default=None,
        help="run the relative changes and the regret are measured against (default: proportional if run, else the "
        "first run)",
    )
    parser.add_argument(
        "--reference_run",
        default=None,
        help="a finished run's output_dir: every run is also scored by its excess held-out loss over this run's "
        "(default: the --reference_run given to every run after --, if any)",
    )
    parser.add_argument("--launcher", default="", help='e.g. "accelerate launch --num_processes 2 ..."')
    parser.add_argument(
        "--recipe", choices=list(RECIPES), help="pre-training recipe (default: the one the --config file is for)"
    )
    return parser


def parse_arguments(argv: list[str]) -> tuple[argparse.Namespace, list[tuple[str, str, dict[str, str]]]]:
    """The command line (``cli.overrides``: the options after ``--``, for every run; ``cli.recipe`` resolved) and
    the planned runs (:func:`plan_runs`)."""
    overrides = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = build_parser()
    cli = parser.parse_args(own)
    cli.overrides = overrides
    try:
        cli.recipe = cli.recipe or recipe_for_config(load_config_file(cli.config) if cli.config else {})
        runs = plan_runs(cli.strategies, cli.sweep)
    except ValueError as err:
        parser.error(str(err))
    return cli, runs


def check_plan(
    cli: argparse.Namespace, runs: list[tuple[str, str, dict[str, str]]]
) -> tuple[str | None, dict[str, float] | None]:
    """Refuse, before any run, bad seeds, output directory, swept values or baseline, options every run would
    refuse, and a reference run of other tasks; the reference run and its held-out losses (``None`` without one)."""
    problems = [f"--seeds must be >= 0, got {seed}" for seed in cli.seeds if seed < 0]
    problems += [f"--output_dir {cli.output_dir}: {why}" for why in [path_problem(cli.output_dir, "output_dir")] if why]
    for name, values in (parse_sweep(sweep) for sweep in cli.sweep or []):
        problems += [f"--sweep {name}={value}: {why}" for value in values for why in sweep_value_problems(name, value)]
    run_names = [name for name, _, _ in runs]
    if cli.baseline is not None and cli.baseline not in run_names:
        problems.append(
            f"--baseline {cli.baseline} is not among the runs ({', '.join(run_names)}); add its strategy to "
            "--strategies or name one of those runs"
        )
    recipe_argv = [*(["--config", cli.config] if cli.config else []), *cli.overrides]  # what every run is given
    try:
        tasks, recipe_reference_run = planned_runs(cli.recipe, recipe_argv)
    except UsageError as err:
        raise UsageError(*(f"the options of every run: {problem}" for problem in err.args)) from err
    reference_run = cli.reference_run or recipe_reference_run
    reference = None
    if reference_run is not None:
        option = "--reference_run" if cli.reference_run else "--reference_run (of every run)"
        try:
            reference = ReferenceRun.load(reference_run, option).losses
        except ValueError as err:
            problems.append(str(err))
    refuse(problems)
    if reference is not None:
        refuse([why for why in [task_mismatch(tasks, list(reference), f"the reference run {reference_run}")] if why])
    return reference_run, reference


def write_comparison(
    reports: dict[str, list[dict]],
    cli: argparse.Namespace,
    baseline: str,
    reference_run: str | None,
    reference: dict[str, float] | None,
) -> dict:
    """Aggregate the runs' task reports over their common tasks and write ``comparison.json``, ``comparison.md``
    and the plots into ``cli.output_dir``; the comparison."""
    output_dir = Path(cli.output_dir)
    reports, unscored = restrict_to_common_tasks(reports)
    table = aggregate_runs(reports)
    scores = aggregate_scores(reports, reference, baseline)
    result = {
        "strategies": cli.strategies,
        "seeds": cli.seeds,
        "sweeps": cli.sweep or [],
        "overrides": cli.overrides,
        "baseline": baseline,
        "reference_run": None if reference_run is None else str(reference_run),
        "reference_losses": reference,
        "runs": table,
        "scores": scores,
        "unscored_tasks": unscored,
    }
    (output_dir / "comparison.json").write_text(json.dumps(result, indent=2) + "\n")
    markdown = comparison_markdown(table, baseline) + "\n" + scores_markdown(scores, baseline, reference_run)
    if unscored:
        markdown += (
            f"\nNot scored: {', '.join(unscored)} (no held-out target in some run); means and worst tasks are over the "
            "other tasks.\n"
        )
    (output_dir / "comparison.md").write_text(markdown)
    plot_comparison(scores, output_dir, frontier=bool(cli.sweep))
    print(markdown)
    return result


if __name__ == "__main__":
    raise SystemExit(main())
