"""A sweep spec: the grid of cells (model x objective x fine-tuning method, each a list of gin
files and bindings), the seeds, the fine-tuning tasks, the lenses (a metric of each pre-trained
model on its pre-training task's held-out split) and a token budget per cell, read from a gin file
at one scale (`SWEEP_SCALE`: ci, cpu or tpu; same gin, different sizes and steps)."""
from __future__ import annotations

import dataclasses
import inspect
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import gin

from t5lite import gin_checks
from t5lite.errors import ConfigError

CELL_KEYS = {"pretrain", "finetune", "bindings", "finetune_bindings", "task_bindings", "task_prefix", "tokens_per_row",
             "probe_model", "pretrain_from", "start_from"}
SCALE_KEYS = {"seeds", "pretrain_tokens", "batch_size", "finetune_steps", "finetune_batch_size",
              "eval_max_examples", "pretrain_eval_examples", "bindings", "parallel", "tasks", "pilot"}
PILOT_SEEDS = 3   # a pilot's seeds unless the scale's `pilot` says otherwise
# Lens metrics measured by `t5lite probe` on the pre-trained model (the probe it runs), not logged by its run.
PROBE_LENSES = {"pos_probe": "pos"}
# A lens metric `forgetting_<metric>` is the change of the base's held-out `<metric>` that fine-tuning
# on the sweep's forgetting task caused (`t5lite eval --forgetting`: fine-tuned minus base).
FORGETTING = "forgetting_"
POSITIVE_SCALE_KEYS = {"pretrain_tokens", "batch_size", "finetune_steps", "finetune_batch_size", "eval_max_examples",
                       "pretrain_eval_examples", "parallel"}
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclasses.dataclass(frozen=True)
class Cell:
    """One row of the table: how to pre-train it and how to fine-tune it on each task."""
    name: str
    pretrain: tuple[str, ...]
    finetune: tuple[str, ...]
    bindings: tuple[str, ...] = ()
    finetune_bindings: tuple[str, ...] = ()
    task_bindings: tuple[tuple[str, tuple[str, ...]], ...] = ()   # (task, its fine-tuning run's extra bindings)
    task_prefix: str = "glue_"
    tokens_per_row: int = 128
    probe_model: str | None = None   # what the probe lenses read for a cell without pre-training (e.g. GloVe's file)
    pretrain_from: str | None = None   # another cell whose pre-training (same seed) this one fine-tunes from
    start_from: str | None = None   # a checkpoint made elsewhere (a converted Hugging Face model) it fine-tunes from

    def start(self, folder, seed: int):
        """The checkpoint this cell's run `folder` of `seed` fine-tunes from: its pre-training, its
        source cell's of the same seed (`pretrain_from`), `start_from`, or None (from scratch)."""
        if self.pretrain:
            return folder / "pretrain"
        if self.pretrain_from:
            return folder.parent / f"{self.pretrain_from}__seed{seed}" / "pretrain"
        return self.start_from

    def probed_model(self, folder) -> str | None:
        """What the probe lenses read for this cell's run `folder`: its pre-training or `start_from`,
        else `probe_model` (a cell fine-tuned from another's pre-training is probed in that one's row)."""
        if self.pretrain:
            return str(folder / "pretrain")
        return self.start_from or self.probe_model

    def finetune_bindings_for(self, task: str) -> tuple[str, ...]:
        return (*self.finetune_bindings, *dict(self.task_bindings).get(task, ()))


@dataclasses.dataclass(frozen=True)
class Claim:
    """A published result about rows `better` and `worse` on `column` (a task, a lens, or
    'glue_average': each task): `better` beats `worse`, or, with a `margin`, the two are on par
    within ±margin. `effect` is the paper's difference in the metric's points (a loss's nats), which
    the seed counts are sized for."""
    text: str
    better: str
    worse: str
    column: str = "glue_average"
    effect: float | None = None
    margin: float | None = None

    def judged_on(self, tasks, lenses=()) -> list[str]:
        """The columns its verdicts are made on, each on its own: every one of the sweep's `tasks`
        for 'glue_average', else its column where the sweep runs it (a task or one of `lenses`)."""
        return list(tasks) if self.column == "glue_average" else [c for c in (*tasks, *lenses) if c == self.column]


@dataclasses.dataclass(frozen=True)
class Spec:
    name: str
    scale: str
    cells: tuple[Cell, ...]
    tasks: Mapping[str, str]          # task -> its metric (the key of `eval_<metric>`)
    seeds: tuple[int, ...]
    pretrain_tokens: int
    batch_size: int
    finetune_steps: int
    finetune_batch_size: int
    eval_max_examples: int | None
    scale_bindings: tuple[str, ...]
    parallel: int
    claims: tuple[Claim, ...]
    command: tuple[str, ...]
    data_dir: str | None = None
    pilot_sizes: Mapping = dataclasses.field(default_factory=dict)   # `pilot`'s fields where they differ
    lenses: Mapping[str, str] = dataclasses.field(default_factory=dict)   # lens -> the pre-training run's eval metric
    pretrain_eval_examples: int | None = None   # how many held-out examples the lenses read (None: the split)
    probe_data_dir: str | None = None   # UD English-EWT, for the probe lenses
    task_variants: Mapping[str, tuple[str, tuple[str, ...]]] = dataclasses.field(default_factory=dict)
    forgetting_task: str | None = None   # the task column whose fine-tuning the forgetting lenses measure

    def cell(self, name: str) -> Cell:
        return next(c for c in self.cells if c.name == name)

    def registered_task(self, column: str) -> str:
        """The task a column fine-tunes on (a variant's own task, else the column), before the cell's prefix."""
        return self.task_variants[column][0] if column in self.task_variants else column

    def variant_bindings(self, column: str) -> tuple[str, ...]:
        """The fine-tuning bindings a task variant adds (e.g. 'train.train_examples = 100')."""
        return self.task_variants[column][1] if column in self.task_variants else ()

    @property
    def probe_lenses(self) -> dict[str, str]:
        """{lens: probe} of the lenses `t5lite probe` measures."""
        return {lens: PROBE_LENSES[metric] for lens, metric in self.lenses.items() if metric in PROBE_LENSES}

    @property
    def forgetting_lenses(self) -> dict[str, str]:
        """{lens: the base's metric} of the lenses `t5lite eval --forgetting` measures."""
        return {lens: metric.removeprefix(FORGETTING) for lens, metric in self.lenses.items() if is_forgetting(metric)}

    @property
    def eval_lenses(self) -> dict[str, str]:
        """{lens: metric} of the lenses the pre-training run's own evaluation logs."""
        return {lens: metric for lens, metric in self.lenses.items()
                if metric not in PROBE_LENSES and not is_forgetting(metric)}

    def pretrain_steps(self, cell: Cell) -> int:
        """Steps that spend the token budget: budget / (batch size x tokens per row), at least 1; 0 for
        a cell that fine-tunes from scratch."""
        if not cell.pretrain:
            return 0
        return max(1, self.pretrain_tokens // (self.batch_size * cell.tokens_per_row))


def is_forgetting(metric: str) -> bool:
    return metric.startswith(FORGETTING)


@gin.configurable
def sweep(name: str = gin.REQUIRED, scale: str = gin.REQUIRED, cells: Mapping = gin.REQUIRED,
          tasks: Mapping = gin.REQUIRED, scales: Mapping = gin.REQUIRED, claims: Sequence = (),
          command: Sequence[str] = (), data_dir: str | None = None, lenses: Mapping | None = None,
          probe_data_dir: str | None = None, task_variants: Mapping | None = None,
          forgetting_task: str | None = None) -> Spec:
    """The sweep a gin file describes, checked. `data_dir` is the fine-tuning configs' DATA_DIR (the GLUE
    folder); `command` replaces `python -m t5lite.cli` as what runs `train`. `lenses` names metrics
    of the pre-trained model itself, {lens: metric}: each pre-training run evaluates its task's
    validation split at its last step and the lens is its `eval_<metric>` (e.g. 'mlm_loss'), a
    column beside the tasks that claims may name; a cell whose objective logs no such metric has none.
    The metric 'pos_probe' is instead the best layer's accuracy of `t5lite probe --probes pos` on the
    pre-trained model, reading UD English-EWT from `probe_data_dir`. The metric 'forgetting_<metric>'
    (e.g. 'forgetting_mlm_loss') is what fine-tuning on `forgetting_task` (default: the first task)
    did to the base's held-out `<metric>`: `t5lite eval --forgetting` of that fine-tuned run, with the
    base run's own config.gin, fine-tuned minus base; a cell from scratch has none.

    A cell with `'pretrain': []` fine-tunes from random weights (the from-scratch row). A column of
    `tasks` may be a variant of a task, `task_variants = {'sst2_100': ('sst2', ['train.train_examples
    = 100'])}`: the task fine-tuned with those bindings too (fewer labels, another rate), judged on
    the task's dev set like the task itself."""
    if scale not in scales:
        raise ConfigError(f"sweep {name!r}: SWEEP_SCALE={scale!r} is not one of {sorted(scales)}; "
                          f"pass --gin.SWEEP_SCALE=\"'{next(iter(scales), 'ci')}'\"")
    where = f"sweep {name!r} scale {scale!r}"
    size = dict(scales[scale])
    _check_keys(where, size, SCALE_KEYS)
    pilot = dict(size.pop("pilot", {}))
    sizes = _sizes(where, size)
    _check_keys(f"{where} 'pilot'", pilot, SCALE_KEYS - {"tasks", "pilot"})
    pilot_sizes = _sizes(f"{where} 'pilot'", {**size, "seeds": PILOT_SEEDS, **pilot})
    if len(pilot_sizes["seeds"]) < 2:
        raise ConfigError(f"{where} 'pilot' runs {len(pilot_sizes['seeds'])} seed; a pilot measures the spread "
                          "between seeds: give 'seeds': 2 or more")
    for task in tasks:
        _check_name(f"sweep {name!r} task {task!r}", task)
    variants = {}
    for column, given in dict(task_variants or {}).items():
        where = f"sweep {name!r} task variant {column!r}"
        if column not in tasks:
            raise ConfigError(f"{where} is not a column of sweep.tasks {sorted(tasks)}; add it there with its metric")
        if (not isinstance(given, (list, tuple)) or len(given) != 2 or not isinstance(given[0], str)
                or not isinstance(given[1], (list, tuple)) or not all(isinstance(b, str) for b in given[1])):
            raise ConfigError(f"{where}: give (task, [bindings]), e.g. ('sst2', ['train.train_examples = 100'])")
        variants[column] = (given[0], tuple(given[1]))
    lenses = dict(lenses or {})
    for lens, metric in lenses.items():
        _check_name(f"sweep {name!r} lens {lens!r}", lens)
        if lens in tasks or lens == "glue_average":
            raise ConfigError(f"sweep {name!r} lens {lens!r} has a task's name; name it apart from {sorted(tasks)}")
        if not isinstance(metric, str) or not NAME.fullmatch(metric):
            raise ConfigError(f"sweep {name!r} lens {lens!r}: its metric is {metric!r}; give the name the pre-training "
                              f"run logs as eval_<metric>, e.g. 'mlm_loss', or one of {sorted(PROBE_LENSES)}")
        if metric == FORGETTING:
            raise ConfigError(f"sweep {name!r} lens {lens!r}: name the base's held-out metric it measures the change "
                              "of, e.g. 'forgetting_mlm_loss'")
        if metric in PROBE_LENSES and not probe_data_dir:
            raise ConfigError(f"sweep {name!r} lens {lens!r} probes the pre-trained model on UD English-EWT: set "
                              "sweep.probe_data_dir to its folder, e.g. --gin.sweep.probe_data_dir=\"'data/ud'\"")
    parsed = []
    for cell_name, cell in cells.items():
        _check_name(f"sweep {name!r} cell {cell_name!r}", cell_name)
        _check_keys(f"sweep {name!r} cell {cell_name!r}", cell, CELL_KEYS)
        _check_positive(f"sweep {name!r} cell {cell_name!r} 'tokens_per_row'", cell.get("tokens_per_row", 1))
        if "pretrain" not in cell or not cell.get("finetune"):
            raise ConfigError(f"sweep {name!r} cell {cell_name!r}: give 'pretrain' and 'finetune' lists of gin files "
                              "('pretrain': [] fine-tunes from scratch)")
        starts = [key for key in ("pretrain_from", "start_from", "probe_model") if cell.get(key) is not None]
        if len(starts) > 1 or starts and cell["pretrain"] or not all(isinstance(cell[key], str) for key in starts):
            raise ConfigError(f"sweep {name!r} cell {cell_name!r}: give at most one of 'pretrain_from' (a cell), "
                              "'start_from' (a checkpoint) or 'probe_model' (a path), each with 'pretrain': [] and "
                              "as a string")
        fields = {k: tuple(v) if isinstance(v, (list, tuple)) else v for k, v in cell.items()}
        per_task = dict(cell.get("task_bindings", {}))
        if set(per_task) - set(tasks):
            raise ConfigError(f"sweep {name!r} cell {cell_name!r}: task_bindings names {sorted(set(per_task) - set(tasks))}, "
                              f"not in sweep.tasks {sorted(tasks)}")
        fields["task_bindings"] = tuple((task, tuple(b)) for task, b in per_task.items())
        parsed.append(Cell(cell_name, **fields))
    names = {c.name for c in parsed}
    pretrained = {c.name for c in parsed if c.pretrain}
    for cell in parsed:
        if cell.pretrain_from is not None and cell.pretrain_from not in pretrained:
            raise ConfigError(f"sweep {name!r} cell {cell.name!r}: 'pretrain_from' names a cell that pre-trains "
                              f"({', '.join(sorted(pretrained)) or 'none does'}), whose run of each seed this cell "
                              "fine-tunes from")
    claims_ = tuple(_claim(name, c) for c in claims)
    for claim in claims_:
        if claim.column not in (*tasks, *lenses, "glue_average"):
            raise ConfigError(f"sweep {name!r} claim {claim.text!r}: column {claim.column!r} is neither a task "
                              f"{sorted(tasks)}, a lens {sorted(lenses)} nor 'glue_average'")
        for row in (claim.better, claim.worse):
            if row not in names:
                raise ConfigError(f"sweep {name!r} claim {claim.text!r}: no cell named {row!r} (cells: {sorted(names)})")
    if "tasks" in size:   # a scale may run fewer: the columns of its tasks, variants included
        underlying = {column: variants.get(column, (column,))[0] for column in tasks}
        kept = {t: m for t, m in tasks.items() if underlying[t] in size["tasks"]}
        if not kept:
            raise ConfigError(f"sweep {name!r} scale {scale!r}: its tasks {sorted(size['tasks'])} leave none of "
                              f"sweep.tasks {sorted(tasks)}")
        tasks = kept
    forgetting_task = _forgetting_task(name, scale, lenses, forgetting_task, tasks)
    return Spec(name=name, scale=scale, cells=tuple(parsed), tasks=dict(tasks), claims=claims_, command=tuple(command),
                data_dir=data_dir, pilot_sizes=pilot_sizes, lenses=dict(lenses), probe_data_dir=probe_data_dir,
                task_variants=variants, forgetting_task=forgetting_task, **sizes)


def _forgetting_task(name: str, scale: str, lenses: Mapping, given: str | None, tasks: Mapping) -> str | None:
    """The task column the forgetting lenses measure (the first of the scale's tasks unless given);
    None without such a lens. Given for a sweep without one, or naming a column the scale does not
    run, it is refused: the lens would measure nothing."""
    where = f"sweep {name!r} scale {scale!r}"
    if not any(map(is_forgetting, lenses.values())):
        if given is not None:
            raise ConfigError(f"{where}: sweep.forgetting_task is set but no lens is 'forgetting_<metric>'; add one, "
                              "e.g. sweep.lenses = {'forgetting': 'forgetting_mlm_loss'}, or drop forgetting_task")
        return None
    if given is None:
        return next(iter(tasks))
    if given not in tasks:
        raise ConfigError(f"{where}: sweep.forgetting_task {given!r} is not one of the tasks it fine-tunes "
                          f"{sorted(tasks)}; name one of them")
    return given


def _sizes(where: str, size: Mapping) -> dict:
    """A scale's sizes, checked, as Spec's fields."""
    for key in POSITIVE_SCALE_KEYS & set(size):
        if size[key] is not None:   # eval_max_examples None: the whole dev set
            _check_positive(f"{where} {key!r}", size[key])
    seeds = size.get("seeds", 2)
    if isinstance(seeds, int):
        _check_positive(f"{where} 'seeds'", seeds)
        seeds = range(seeds)
    elif not seeds or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        raise ConfigError(f"{where} 'seeds' is {seeds!r}; give a count or a list of seeds >= 0")
    return dict(seeds=tuple(seeds), pretrain_tokens=int(size.get("pretrain_tokens", 4096)),
                batch_size=int(size.get("batch_size", 8)), finetune_steps=int(size.get("finetune_steps", 4)),
                finetune_batch_size=int(size.get("finetune_batch_size", size.get("batch_size", 8))),
                eval_max_examples=size.get("eval_max_examples"), pretrain_eval_examples=size.get("pretrain_eval_examples"),
                scale_bindings=tuple(size.get("bindings", ())),
                parallel=int(size.get("parallel", 2)))


def pilot(spec: Spec) -> Spec:
    """The sweep's pilot: the cells its claims compare (and those they fine-tune from), at the scale's `pilot` sizes (by default
    the scale's own, with PILOT_SEEDS seeds), so a report can measure each task's seed-to-seed
    spread and distance from chance before the sweep is sized."""
    compared = {row for claim in spec.claims for row in (claim.better, claim.worse)}
    compared |= {cell.pretrain_from for cell in spec.cells if cell.name in compared and cell.pretrain_from}
    if not compared:
        raise ConfigError(f"--pilot: sweep {spec.name!r} has no claim between the cells it runs; a pilot measures "
                          "what the claims need: give --cells two rows a claim compares, or leave --cells out")
    return dataclasses.replace(spec, scale=f"{spec.scale} pilot", cells=tuple(c for c in spec.cells if c.name in compared),
                               pilot_sizes={}, **spec.pilot_sizes)


def _claim(sweep_name: str, given) -> Claim:
    """A claim tuple (text, better, worse[, column[, {'effect': points} or {'margin': points}]])."""
    options = dict(given[4]) if len(given) > 4 and isinstance(given[4], Mapping) else {}
    where = f"sweep {sweep_name!r} claim {given[0]!r}"
    if not 3 <= len(given) <= 5 or len(given) == 5 and not options:
        raise ConfigError(f"{where}: give (text, better row, worse row, column, {{'effect': points}}); the column "
                          "and the options may be left out")
    _check_keys(where, options, {"effect", "margin"})
    for key, value in options.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{where}: {key!r} is {value!r}; give the paper's {key} in the metric's points, a number > 0")
    return Claim(*given[:4], **{k: float(v) for k, v in options.items()})


def only_cells(spec: Spec, names: Sequence[str]) -> Spec:
    """The sweep cut to the cells `names` (`--cells`), keeping the claims between two of them: a
    quick look at a few rows, whose run folders a later full sweep on the same --out reuses."""
    known = [cell.name for cell in spec.cells]
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ConfigError(f"--cells {','.join(names)}: sweep {spec.name!r} has no cell named {unknown[0]!r}; "
                          f"give some of {', '.join(known)}, separated by commas")
    cells = tuple(cell for cell in spec.cells if cell.name in names)
    for cell in cells:
        if cell.pretrain_from and cell.pretrain_from not in names:
            raise ConfigError(f"--cells {','.join(names)}: cell {cell.name!r} fine-tunes from {cell.pretrain_from!r}'s "
                              f"pre-training; add {cell.pretrain_from} (its finished runs are not trained again)")
    claims = tuple(c for c in spec.claims if {c.better, c.worse} <= set(names))
    return dataclasses.replace(spec, cells=cells, claims=claims)


def _check_name(where: str, name) -> None:
    """Cell and task names become folder names (`<cell>__seed<k>/finetune_<task>`) and gin strings."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ConfigError(f"{where}: a name becomes a folder name; use letters, digits, '_', '-' and '.', "
                          "starting with a letter or digit")


def _check_positive(where: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"{where} is {value!r}; give a whole number >= 1")


def _check_keys(where: str, given: Mapping, allowed: set[str]) -> None:
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def load(files: Sequence[str], bindings: Sequence[str], search_paths: Sequence[str]) -> Spec:
    """Parses a sweep gin file (and `--gin.X=Y` bindings) into a Spec; any error is one line."""
    gin.clear_config()
    for path in search_paths:
        gin.add_config_file_search_path(path)
    if not files:
        raise ConfigError("no --gin_file given: a sweep is described by a gin file; pass "
                          f"--gin_file=configs/sweeps/NAME.gin (NAME: {', '.join(_shipped_sweeps(search_paths))})")
    gin_checks.check_includes(files, search_paths)
    try:
        gin.parse_config_files_and_bindings(list(files), list(bindings), finalize_config=False)
        _check_given(files)
        return sweep()
    except ConfigError:
        raise
    except (ValueError, TypeError, KeyError, IOError, SyntaxError, RuntimeError) as e:
        message = " ".join(line.strip() for line in str(e).splitlines()
                           if not line.strip().startswith("In call to configurable"))
        raise ConfigError(f"sweep gin error in {', '.join(files)}: {message}") from e


def _shipped_sweeps(search_paths: Sequence[str]) -> list[str]:
    """The sweep files under configs/sweeps/ (scales.gin is what they include, not a sweep)."""
    return sorted({path.stem for root in search_paths for path in Path(root, "configs", "sweeps").glob("*.gin")}
                  - {"scales"})


def _check_given(files: Sequence[str]) -> None:
    """Names the sweep settings and macros no file or flag gave, and where to give them: gin's own error
    names neither the file nor the flag."""
    from t5lite.gin_checks import is_bound, macro_defined, referenced_macros
    where = f"--gin_file {', '.join(files)}"
    missing = [f"sweep.{param.name}" for param in inspect.signature(sweep).parameters.values()
               if param.default is gin.REQUIRED and not is_bound(f"sweep.{param.name}")]
    if missing:
        raise ConfigError(f"{where} binds no {', '.join(missing)}: a sweep file binds sweep.name, sweep.cells and "
                          "sweep.tasks and includes 'configs/sweeps/scales.gin' (see configs/sweeps/*.gin)")
    undefined = [name for name in referenced_macros("sweep", sweep) if not macro_defined(name)]
    if undefined:
        raise ConfigError(f"{where} uses gin macro(s) {', '.join(undefined)} that nothing sets: pass "
                          + " ".join(f"--gin.{name}=..." for name in undefined))
