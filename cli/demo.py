"""``jobman demo``: a small real sweep of the bundled trainers, start to finish, on SQLite.

It runs the same commands a user would type, printing each one first, so the
demo doubles as a tour: schedule (with phases and a fan-in), dispatch, report.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import click

from jobman.jobdb.errors import JobmanError

from .common import out


def _sweeps(db: str, quick: bool) -> list[tuple[str, list[str]]]:
    """(what it shows, the jobman command line) for every step of the demo."""
    epochs = "10" if quick else "30"
    mlp, dbn = f"{db}?table=mlp", f"{db}?table=dbn"
    return [
        (
            "An MLP sweep: 2 widths x 2 learning rates, each cross-validated over 3 folds (12 jobs).",
            [
                "sqlschedule",
                mlp,
                "jobman.models.mlp:train",
                "dataset=digits",
                "nhid={{64,256}}",
                "lr={{0.01,0.001}}",
                f"epochs={epochs}",
                "nb_cross_fold=3",
                "id_cross_fold={{0,1,2}}",
            ],
        ),
        (
            "A fan-in phase: once every fold is DONE, retrain the best configuration on all training data.",
            ["sqlschedule", mlp, "jobman.models.cv:retrain", "metric=valid_error", "--after", "phase=0"],
        ),
        ("Run them on the local cores, with live progress.", ["dispatch", mlp]),
        ("Which configuration won?", ["report", mlp, "--metric", "valid_error", "--phase", "0"]),
        (
            "The fan-in job retrained that configuration on all the data (cv_mean: its folds' mean):",
            ["list", mlp, "--phase", "1"],
        ),
        (
            "A DBN in two phases: RBM pretraining (phase 0), then supervised fine-tuning of each pretrained "
            "stack (phase 1).",
            [
                "sqlschedule",
                dbn,
                "jobman.models.dbn:pretrain",
                "dataset=digits",
                "n_hidden=256",
                "cd_k={{1,3}}",
                "pretrain_epochs=" + ("5" if quick else "10"),
                "nb_cross_fold=3",
                "id_cross_fold={{0,1,2}}",
                "--",
                "jobman.models.dbn:finetune",
                "lr={{0.01,0.001}}",
                f"epochs={epochs}",
            ],
        ),
        ("Run them: fine-tuning jobs start as soon as their own pretraining is DONE.", ["dispatch", dbn]),
        ("The fine-tuned DBNs, best first:", ["report", dbn, "--metric", "valid_error", "--phase", "1"]),
    ]


@click.command("demo")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False),
    default="jobman-demo",
    show_default=True,
    help="Where the demo's database and job workdirs go.",
)
@click.option("-j", "--workers", type=click.IntRange(1), default=None, help="Workers (default: the number of cores).")
@click.option("--quick", is_flag=True, help="Fewer epochs: a smoke run of a few seconds per job.")
def demo(directory: str, workers: int | None, quick: bool) -> int:
    """Schedule, dispatch and report a small MLP + DBN sweep with 3-fold CV on SQLite.

    \b
    Example:
      jobman demo --dir /tmp/jobman-demo
    Every step is printed as the jobman command it runs, so you can repeat or
    change it by hand afterwards. Running the demo again resumes where it was.
    """
    from .main import main as run

    try:
        import sklearn  # noqa: F401
    except ImportError:
        raise JobmanError(
            "the demo trains on scikit-learn's bundled digits: pip install 'jobman-sql[digits]'"
        ) from None
    root = Path(directory).resolve()
    root.mkdir(parents=True, exist_ok=True)
    db = f"sqlite:///{root / 'demo.db'}"
    os.environ["JOBMAN_EXPROOT"] = str(root / "runs")
    status = 0
    for what, argv in _sweeps(db, quick):
        if argv[0] == "dispatch" and workers:
            argv = [*argv, "-j", str(workers)]
        out.print(f"\n[bold]{what}[/]\n[dim]$ jobman {' '.join(shlex.quote(a) for a in argv)}[/]")
        code = run(argv)
        if code:
            status = code
            if argv[0] == "sqlschedule":
                return code
    out.print(
        f"\n[bold]Done.[/] The database is {root / 'demo.db'}; job workdirs are under {root / 'runs'}.\n"
        f"Try: jobman list '{db}?table=dbn'   jobman show 1 --db '{db}?table=dbn'   "
        f"jobman report '{db}?table=mlp' --plot {root / 'plots'}"
    )
    return status


COMMANDS = [demo]
