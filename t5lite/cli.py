"""`t5lite` command line: train | eval | infer | embed | convert | tasks | prepare | compile | probe | attention.

Gin flags follow T5X: `--gin_file=F` (repeatable) and `--gin.NAME=VALUE` (a gin binding, so
strings need inner quotes: `--gin.MODEL_DIR="'/tmp/run'"`). `eval` and `infer` read
gin/eval.gin or gin/infer.gin first, so a training config serves them as it is:

    t5lite eval --gin_file=configs/local/t5_tiny_finetune_sst2.gin --gin.MODEL_DIR="'/tmp/ft'"
    t5lite infer --gin_file=configs/local/t5_tiny_pretrain.gin --gin.CHECKPOINT_PATH="'/tmp/pt'" "some text"
"""
from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import sys
import traceback
from pathlib import Path

from t5lite import gin_checks, platforms, writable
from t5lite.errors import ConfigError, DataError, T5liteError

REPO_ROOT = Path(__file__).resolve().parent.parent
REQUIRED_MACROS = ("MODEL_DIR", "TRAIN_STEPS", "BATCH_SIZE", "TASK_FEATURE_LENGTHS", "MIXTURE_OR_TASK_NAME")
MACROS_READ_BY_NAME = (*REQUIRED_MACROS, "CHECKPOINT_PATH")   # by this module, whether a binding uses them or not


def split_gin_flags(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """Pulls `--gin_file` and `--gin.X=Y` out of argv: (files, bindings, remaining args)."""
    files, bindings, rest = [], [], []
    it = iter(argv)
    for arg in it:
        if arg.startswith("--gin_file"):
            value = arg.split("=", 1)[1] if "=" in arg else next(it, None)
            if value is None:
                raise ConfigError("--gin_file needs a value: --gin_file=configs/local/t5_tiny_pretrain.gin")
            files.extend(v for v in value.split(",") if v)
        elif arg.startswith("--gin."):
            if "=" not in arg:
                raise ConfigError(f"{arg}: write gin bindings as --gin.NAME=VALUE")
            name, value = arg[len("--gin."):].split("=", 1)
            bindings.append(f"{name} = {value}")
        else:
            rest.append(arg)
    return files, bindings, rest


def parse_gin(files: list[str], bindings: list[str], required_macros=REQUIRED_MACROS, entry=None,
              base_file: str | None = None) -> None:
    """Parses gin files and bindings; a misspelled name, a missing macro or a value of the wrong
    type fails here, naming the binding and the fix.

    `entry` (gin name, function) adds the macros that entry point's bindings refer to to the
    required ones and checks the bound values against the type hints of it and of every other bound
    configurable; `base_file` is read before `files` (the eval / infer wiring). A macro that nothing
    uses is refused (a misspelling would otherwise be ignored).
    """
    import gin
    import t5lite.data.sources  # noqa: F401  (registers configurables)
    import t5lite.infer.embedding  # noqa: F401
    import t5lite.infer.predict  # noqa: F401
    import t5lite.train.optimizers  # noqa: F401
    import t5lite.train.partitioning  # noqa: F401
    import t5lite.train.trainer  # noqa: F401
    search_paths = (os.getcwd(), str(REPO_ROOT))
    for path in search_paths:
        gin.add_config_file_search_path(path)
    logging.getLogger().addFilter(_quiet_gin_search)
    if not files and base_file is None:
        raise ConfigError("no --gin_file given; try --gin_file=configs/local/t5_tiny_pretrain.gin")
    # The repository's own configs by absolute path: from another folder, gin would look for
    # `configs/local/x.gin` in a Python package `configs.local` first and fail on it.
    files = [str(REPO_ROOT / f) if not os.path.exists(f) and (REPO_ROOT / f).is_file() else f for f in files]
    try:
        gin.parse_config_files_and_bindings(([base_file] if base_file else []) + files, None,
                                            finalize_config=False)
    except (ValueError, IOError, SyntaxError) as e:
        raise ConfigError(f"gin file error: {' '.join(line.strip() for line in str(e).splitlines())}") from e
    for binding in bindings:
        _parse_binding(binding)
    gin_checks.check_macros_used(MACROS_READ_BY_NAME, bindings, ([base_file] if base_file else []) + files,
                                 search_paths)
    required = list(required_macros) + (_referenced_macros(*entry) if entry else [])
    missing = list(dict.fromkeys(m for m in required if not _macro_defined(m)))
    if missing:   # a macro defaulting to another (CHECKPOINT_PATH = %MODEL_DIR) takes either
        hint = " ".join(" or ".join(f"--gin.{m}=..." for m in _macro_chain(name)) for name in missing)
        raise ConfigError(f"missing required gin macro(s) {', '.join(missing)}: set them in a gin file or with {hint}")
    if entry:   # `compile` binds placeholders (MODEL_DIR = None) and runs no entry point
        gin_checks.check_bound_types(entry)


def _quiet_gin_search(record: logging.LogRecord) -> bool:
    """Drops gin's log line for every search path an include is not in ("ERROR ... Path not found"):
    an include found in a later search path is not an error."""
    return not record.pathname.endswith(os.path.join("gin", "resource_reader.py"))


def _first_line(error: Exception) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _parse_binding(binding: str) -> None:
    """One `--gin.NAME=VALUE` binding; a parse error names it and shows the quoting rule."""
    import gin
    name, value = (part.strip() for part in binding.split("=", 1))
    try:
        gin.parse_config(binding)
    except SyntaxError:
        unquoted = value.strip("'\"")
        raise ConfigError(f"--gin.{name}={value}: gin cannot parse the value {value!r}; values are Python literals, "
                          f"so a string needs inner quotes: --gin.{name}=\"'{unquoted}'\"") from None
    except ValueError as e:
        raise ConfigError(f"--gin.{name}={value}: {_first_line(e)}") from e


def _referenced_macros(name: str, fn) -> list[str]:
    """The macros `name.<parameter> = %MACRO` bindings of an entry point refer to."""
    import gin
    found = []
    for param in inspect.signature(fn).parameters:
        try:
            value = gin.query_parameter(f"{name}.{param}")
        except ValueError:
            continue
        selector = getattr(value, "scoped_selector", "")
        if selector.endswith("/gin.macro"):
            found.append(selector.split("/")[0])
    return found


def _macro_chain(name: str) -> list[str]:
    """`name` and the macros it is bound to in turn (gin/eval.gin: CHECKPOINT_PATH -> MODEL_DIR)."""
    import gin
    chain = [name]
    while _bound(f"%{chain[-1]}") and len(chain) < 10:
        selector = getattr(gin.query_parameter(f"%{chain[-1]}"), "scoped_selector", "")
        if not selector.endswith("/gin.macro"):
            break
        chain.append(selector.split("/")[0])
    return chain


def _macro_defined(name: str) -> bool:
    """Bound to a value, directly or through other macros."""
    return _bound(f"%{_macro_chain(name)[-1]}")


def check_task_name(entry: str) -> None:
    """Looks up the task the entry point will run, so an unknown name fails before any work."""
    import gin
    name = gin.query_parameter(f"{entry}.mixture_or_task_name")
    if isinstance(name, gin.config.ConfigurableReference):
        name = gin.query_parameter(f"%{name.scoped_selector.split('/')[0]}")
    get_task_or_mixture(name)


def get_task_or_mixture(name: str):
    from t5lite.data import catalog
    try:
        return catalog.get_task_or_mixture(name)
    except KeyError as e:
        raise ConfigError(e.args[0]) from None


def cmd_train(args, gin_files, gin_bindings) -> None:
    import gin
    from t5lite.train.trainer import train
    if args.prune_heads is not None:   # Michel et al.'s head pruning of the starting params
        gin_bindings = [*gin_bindings, "train.pruning = @HeadPruning()", f"HeadPruning.fraction = {args.prune_heads}"]
    parse_gin(gin_files, gin_bindings, entry=("train", train))
    check_task_name("train")
    metrics = train()
    if metrics:  # empty when the run was already at TRAIN_STEPS (train() says so)
        print("final:", " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
    print("model dir:", gin.query_parameter("%MODEL_DIR"))


def cmd_eval(args, gin_files, gin_bindings) -> None:
    from t5lite.infer.evaluation import evaluate
    parse_gin(gin_files, gin_bindings, required_macros=(), entry=("eval", evaluate), base_file="gin/eval.gin")
    _model_from_run_unless_given("eval")
    _objective_from_training_config()
    check_task_name("eval")
    from t5lite.train import cost
    meter = cost.CostMeter(None)   # this call's cost, written to the eval folder's cost.json
    metrics = evaluate(meter=meter)
    print("metrics:", " ".join(f"{k}={v:.4g}" for k, v in metrics.items()))
    print("cost (estimated):", cost.summary(meter.totals()))


def _numbered_lines(path: str) -> list[tuple[int, str]]:
    """(line number, text) of the non-blank lines of a UTF-8 file; a bad byte is reported by line
    and file offset. Blank lines are skipped with a warning naming them (the outputs then number
    fewer than the file's lines), and a file without a non-blank line is an error."""
    from etils import epath
    try:
        data = epath.Path(path).read_bytes()
    except OSError as e:
        raise DataError(f"--input_file {path}: cannot read it ({e.strerror or e})") from e
    lines, offset = [], 0
    for number, raw in enumerate(data.split(b"\n"), 1):
        try:
            line = raw.decode("utf-8-sig" if number == 1 else "utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"--input_file {path}: line {number} is not UTF-8 (byte {offset + e.start} of the file, "
                            f"{raw[e.start:e.start + 1]!r}); save the file as UTF-8, e.g. "
                            f"`iconv -f latin1 -t utf-8 {path} > inputs.utf8.txt`") from None
        offset += len(raw) + 1
        if line.strip():
            lines.append((number, line.rstrip("\r")))
    if not lines:
        raise DataError(f"--input_file {path} is empty (no non-blank line); write one input per line")
    last = len(data.split(b"\n")) - (1 if data.endswith(b"\n") else 0)   # a final newline ends a line
    blank = sorted(set(range(1, last + 1)) - {number for number, _ in lines})
    if blank:
        shown = ", ".join(map(str, blank[:10])) + (", ..." if len(blank) > 10 else "")
        logging.getLogger("t5lite.infer").warning("--input_file %s: skipped %d blank line(s) (line %s); each non-blank "
                                                  "line is one input", path, len(blank), shown)
    return lines


def read_inputs(path: str, field: str | None = None) -> list[str]:
    """The inputs of a prompts file: one per non-blank line, or, for JSON lines (a `.jsonl` file or
    a `field` given), each line's `field` ("input" by default)."""
    lines = _numbered_lines(path)
    if field is None and not path.endswith(".jsonl"):
        return [text for _, text in lines]
    field = field or "input"
    texts = []
    for number, text in lines:
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"--input_file {path}: line {number} is not valid JSON ({e.msg}, column {e.colno}); "
                            f"write one object per line, e.g. {{\"{field}\": \"a prompt\"}}") from None
        if not isinstance(record, dict) or not isinstance(record.get(field), str):
            found = sorted(record) if isinstance(record, dict) else type(record).__name__
            raise DataError(f"--input_file {path}: line {number} has no string field {field!r} (found {found}); "
                            "name the input field with --field")
        texts.append(record[field])
    return texts


def _model_from_run_unless_given(entry: str) -> None:
    """Without a model gin (no `model_config.preset`), `entry` reads the run's model_config.json."""
    import gin
    if not _bound("model_config.preset"):
        gin.bind_parameter(f"{entry}.model", None)


def _objective_from_training_config(entry: str = "eval") -> None:
    """A training config's `train.objective` (a task head, say) is what `t5lite eval` evaluates
    (and `t5lite embed` embeds) with, so the model is built and scored as during training;
    `<entry>.objective` given wins."""
    import gin
    if _bound("train.objective") and not _bound(f"{entry}.objective"):
        gin.bind_parameter(f"{entry}.objective", gin.query_parameter("train.objective"))


def cmd_infer(args, gin_files, gin_bindings) -> None:
    from t5lite.infer.evaluation import write_predictions
    from t5lite.infer.predict import infer
    texts = list(args.text) + (read_inputs(args.input_file, args.field) if args.input_file else [])
    if not texts:
        raise ConfigError("nothing to decode: give texts as arguments or --input_file=FILE (one input per line, "
                          "or JSON lines)")
    if args.output:
        writable.ensure_writable_file(args.output, "--output")
    parse_gin(gin_files, gin_bindings, required_macros=(), entry=("infer", infer), base_file="gin/infer.gin")
    _model_from_run_unless_given("infer")
    records = infer(texts)
    if not args.output:
        for record in records:
            print(json.dumps(record, ensure_ascii=False), flush=True)
        return
    write_predictions(args.output, records)
    print(f"wrote {len(texts)} predictions to {args.output}")


def cmd_embed(args, gin_files, gin_bindings) -> None:
    import numpy as np
    from t5lite.infer.embedding import embed
    texts = list(args.text) + (read_inputs(args.input_file, args.field) if args.input_file else [])
    if not texts:
        raise ConfigError("nothing to embed: give texts as arguments or --input_file=FILE (one text per line, "
                          "or JSON lines)")
    writable.ensure_writable_file(args.output, "--output")
    parse_gin(gin_files, gin_bindings, required_macros=(), entry=("embed", embed), base_file="gin/embed.gin")
    _model_from_run_unless_given("embed")
    _objective_from_training_config("embed")
    embeddings = embed(texts)
    np.save(args.output, embeddings)
    print(f"wrote {embeddings.shape[0]} embeddings of dimension {embeddings.shape[1]} to {args.output}")


def _bound(name: str) -> bool:
    import gin
    try:
        gin.query_parameter(name)
        return True
    except ValueError:
        return False


def cmd_tasks(args, gin_files, gin_bindings) -> None:
    from t5lite.data import catalog
    if args.action == "list":
        tasks, mixtures = catalog.names()
        for name in tasks:
            print(name)
        for name in mixtures:
            print(f"{name} (mixture)")
        return
    if not args.name:
        raise ConfigError("usage: t5lite tasks show NAME [--split S] [--data_dir D] [-n N]")
    if args.num_examples < 1:
        raise ConfigError(f"-n {args.num_examples}: show at least 1 example, e.g. -n 3")
    from t5lite.data.tasks_show import show_examples
    task = get_task_or_mixture(args.name)
    lengths = parse_lengths(args.sequence_length) if args.sequence_length else None
    print(task)
    show_examples(task, args.split, args.num_examples, data_dir=args.data_dir, sequence_length=lengths)


def parse_lengths(text: str) -> dict[str, int]:
    """`inputs=512,targets=114` as {"inputs": 512, "targets": 114}."""
    try:
        return {name.strip(): int(length) for name, length in (kv.split("=") for kv in text.split(","))}
    except ValueError:
        raise ConfigError(f"--sequence_length {text!r}: write FEATURE=LENGTH pairs, "
                          "e.g. inputs=512,targets=114") from None


def _convert_quantized(args) -> None:
    from t5lite.interop import checkpoint
    if bool(args.from_hf) == bool(args.from_run) or args.to_hf or args.merge or args.peft_adapter:
        raise ConfigError(f"t5lite convert --quantize {args.quantize}: give exactly one source, --from_hf HF_DIR or --from_run "
                          "RUN_DIR, and --out DIR")
    writable.ensure_new_dir(args.out, "--out")
    config = checkpoint.quantize(args.out, args.quantize, hf_dir=args.from_hf, run_dir=args.from_run)
    print(f"wrote the {args.quantize} weight-only quantised run {args.out} ({config.arch}); every command loads it, "
          "fine-tuning from it dequantises it")


def cmd_convert(args, gin_files, gin_bindings) -> None:
    from t5lite.interop import checkpoint
    if args.quantize:
        return _convert_quantized(args)
    if args.from_run:
        raise ConfigError("t5lite convert: --from_run RUN_DIR goes with --quantize int8")
    if sum(map(bool, (args.from_hf, args.to_hf, args.merge, args.from_elmo, args.to_elmo))) != 1:
        raise ConfigError("t5lite convert: give exactly one of --from_hf HF_DIR, --to_hf RUN_DIR, --merge RUN_DIR, "
                          "--from_elmo WEIGHTS_HDF5 or --to_elmo RUN_DIR, and --out DIR")
    if bool(args.from_elmo) != bool(args.elmo_options):
        raise ConfigError("t5lite convert: --from_elmo WEIGHTS_HDF5 needs --elmo_options OPTIONS_JSON (and only it)")
    if args.peft_adapter and not args.from_hf:
        raise ConfigError("t5lite convert: --peft_adapter DIR goes with --from_hf BASE_DIR (the adapter's base)")
    writable.ensure_new_dir(args.out, "--out")
    if args.from_hf:
        config = checkpoint.hf_to_t5lite(args.from_hf, args.out, args.peft_adapter)
        if os.path.exists(os.path.join(args.out, "peft.json")):
            print(f"wrote the PEFT run {args.out} on the imported base {os.path.join(args.out, 'base')}; "
                  "evaluate or infer with the run")
        else:
            print(f"wrote t5lite checkpoint {args.out} ({config.arch}); fine-tune from it with "
                  f"--gin.INITIAL_CHECKPOINT_PATH=\"'{args.out}'\"")
    elif args.from_elmo or args.to_elmo:
        _convert_elmo(args)
    elif args.merge:
        checkpoint.merge_peft_run(args.merge, args.out)
        print(f"wrote the merged full checkpoint {args.out}")
    else:
        checkpoint.t5lite_to_hf(args.to_hf, args.out, preset=args.preset)
        print(f"wrote Hugging Face folder {args.out}")


def _convert_elmo(args) -> None:
    from t5lite.interop import elmo
    if args.from_elmo:
        elmo.to_run(args.elmo_options, args.from_elmo, args.out)
        print(f"wrote t5lite ELMo run {args.out}; use it with --gin.INITIAL_CHECKPOINT_PATH=\"'{args.out}'\"")
    else:
        os.makedirs(args.out, exist_ok=True)
        elmo.from_run(args.to_elmo, os.path.join(args.out, "options.json"), os.path.join(args.out, "weights.hdf5"))
        print(f"wrote {args.out}/options.json and {args.out}/weights.hdf5")


def cmd_prepare(args, gin_files, gin_bindings) -> None:
    import shlex
    from t5lite.data import prepare
    given = {"min_words_per_line": args.min_words, "min_num_sentences": args.min_sentences,
             "max_page_length": args.max_page_length}
    options = prepare.Options(**{k: v for k, v in given.items() if v is not None},
                              language_filter=not args.no_language_filter and _have_langdetect(),
                              bad_words=prepare.read_bad_words(args.bad_words) if args.bad_words else ())
    flags = ["--input", *args.input, "--output", args.output]
    for name in ("split", "bad_words", "min_words", "min_sentences", "max_page_length"):
        if getattr(args, name) not in (None, "train"):
            flags += [f"--{name}", str(getattr(args, name))]
    flags += ["--no_language_filter"] if args.no_language_filter else []
    manifest = prepare.prepare(args.input, args.output, workers=args.workers, options=options, split=args.split,
                               command=shlex.join(["t5lite", "prepare", *flags]))
    counts = manifest["counts"]
    print(" ".join(f"{k}={v}" for k, v in counts.items() if v))
    print(f"kept {counts['documents_kept']} of {counts['documents_in']} documents in {len(manifest['shards'])} "
          f"shard(s) in {args.output}; train on them with data_dir={args.output}")


def _have_langdetect() -> bool:
    """Language id runs when `langdetect` (the `c4` extra) is installed; without it, a warning says so."""
    import importlib.util
    if importlib.util.find_spec("langdetect"):
        return True
    logging.getLogger("t5lite.prepare").warning(
        "langdetect is not installed (pip install 't5lite[c4]'): the English filter is off for this run")
    return False


def cmd_compile(args, gin_files, gin_bindings) -> None:
    from t5lite.train.tpu_compile import compile_decode_from_gin, compile_from_gin
    if args.mode == "infer":
        parse_gin(gin_files, gin_bindings + ["CHECKPOINT_PATH = None"], required_macros=(),
                  base_file="gin/infer.gin")
    else:
        parse_gin(gin_files, gin_bindings + ["MODEL_DIR = None"],
                  required_macros=("BATCH_SIZE", "TASK_FEATURE_LENGTHS"))
    report = (compile_decode_from_gin if args.mode == "infer" else compile_from_gin)(args.topology, args.num_slices)
    print(report.format())
    if not report.fits:
        raise SystemExit(2)


def _subject(args, needs: str | None):
    """The model of `t5lite probe` / `attention`, once the flag `needs` names is given and --out is writable."""
    from t5lite.analysis import loading
    if needs and not getattr(args, needs):
        raise ConfigError(f"t5lite {args.command}: give --{needs}" + (
            " DIR (the folder with en_ewt/ and uner_en_ewt/)" if needs == "data_dir" else " FILE"))
    writable.ensure_writable_dir(args.out, "--out")
    return loading.load(args.model, args.vocabulary, args.name)


def cmd_probe(args, gin_files, gin_bindings) -> None:
    from t5lite.analysis import neighbours, probe, words
    subject = _subject(args, "corpus" if args.neighbours else "data_dir")
    if args.neighbours:
        read = words.read_conll if args.corpus.endswith(".conllu") else words.read_text
        result = neighbours.neighbours(subject, read(args.corpus, args.corpus_sentences), args.neighbours,
                                       args.layer, args.k, args.pool)
        print(f"wrote {neighbours.write(result, args.out)}")
        return
    results = probe.run(subject, args.data_dir, args.probes.split(","), args.train_sentences, args.test_sentences,
                        args.rank, args.epochs, args.l2, not args.no_control, args.seed, args.span_pooling)
    print("wrote " + ", ".join(probe.write(results, args.out)))


def cmd_attention(args, gin_files, gin_bindings) -> None:
    import os
    from t5lite.analysis import attention, forward, words
    subject = _subject(args, "data_dir")
    sentences = forward.fitting(subject, words.read_conll(
        os.path.join(args.data_dir, f"en_ewt/en_ewt-ud-{args.split}.conllu"), args.sentences))
    results, weights = attention.analyse(subject, sentences)
    print("wrote " + ", ".join(attention.write(subject, results, weights, sentences, args.out, args.example)))


def cmd_sweep(args, gin_files, gin_bindings) -> None:
    """Runs a sweep's unfinished cells (t5lite.experiments), then writes OUT/report.md and report.json."""
    from t5lite.experiments import report, runner, spec
    from t5lite.train.run_dir import RunLock
    if args.parallel is not None and args.parallel < 1:
        raise ConfigError(f"--parallel {args.parallel}: give the number of cells to run at once, a whole number >= 1")
    sweep = spec.load(gin_files, gin_bindings, (os.getcwd(), str(REPO_ROOT)))
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"--out {out}: {e.strerror}; choose a folder that can be written") from None
    with RunLock(str(out), flag="--out"):   # a second sweep on the folder would rerun its cells
        runner.run_sweep(sweep, out, args.parallel)
        report.write(sweep, out)
    print(f"wrote {out / 'report.md'} and report.json")


def _add_text_inputs(parser: argparse.ArgumentParser, text_help: str) -> None:
    """The input flags `t5lite infer` and `t5lite embed` share: texts, or a file of them."""
    parser.add_argument("text", nargs="*", help=text_help)
    parser.add_argument("--input_file", default=None,
                        help="a UTF-8 file with one input text per line, or JSON lines (.jsonl or --field)")
    parser.add_argument("--field", default=None, help="the input field of JSON lines (default: input)")


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true",
                        help="show the traceback of t5lite's own errors too (or set T5LITE_DEBUG=1)")
    parser = argparse.ArgumentParser(prog="t5lite", description=__doc__, parents=[common],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", parents=[common],
                           help="train or resume a model (gin flags: --gin_file, --gin.NAME=VALUE)")
    train.add_argument("--prune_heads", type=float, default=None, metavar="FRACTION",
                       help="prune this fraction of the attention heads, least important first (Michel et al.), "
                            "from the starting params: train.pruning=@HeadPruning() with HeadPruning.fraction")
    train.set_defaults(fn=cmd_train)
    evaluate = sub.add_parser("eval", parents=[common],
                              help="evaluate a checkpoint on a task split (gin: MODEL_DIR for its latest "
                                   "checkpoint or CHECKPOINT_PATH, MIXTURE_OR_TASK_NAME, eval.split, "
                                   "eval.data_dir, eval.output_dir)")
    evaluate.set_defaults(fn=cmd_eval)
    infer = sub.add_parser("infer", parents=[common],
                           help="decode texts with a checkpoint, JSON lines out (gin: CHECKPOINT_PATH, "
                                "infer.method; gin/infer.gin)")
    _add_text_inputs(infer, "input texts, e.g. \"sst2 sentence: a fine film\"")
    infer.add_argument("--output", default=None, help="write the JSON lines to this file instead of stdout")
    infer.set_defaults(fn=cmd_infer)
    embed = sub.add_parser("embed", parents=[common],
                           help="sentence embeddings of texts with an encoder's checkpoint, .npy out (gin: "
                                "CHECKPOINT_PATH, embed.pooling, embed.normalize; gin/embed.gin)")
    _add_text_inputs(embed, "input texts")
    embed.add_argument("--output", required=True, help="the .npy file to write: [inputs, dim] float32, in input order")
    embed.set_defaults(fn=cmd_embed)
    convert = sub.add_parser("convert", parents=[common], help="Hugging Face folder <-> t5lite checkpoint")
    convert.add_argument("--from_hf", help="a Hugging Face model folder (config.json + weights) to import")
    convert.add_argument("--to_hf", help="a t5lite run directory (or step directory) to export")
    convert.add_argument("--out", required=True, help="the directory to write: new or empty (never overwritten)")
    convert.add_argument("--peft_adapter", default=None,
                         help="with --from_hf: a peft LoRA adapter folder (adapter_config.json + "
                              "adapter_model.safetensors) to merge into the imported base, or a prefix- or "
                              "prompt-tuning one: OUT is then a PEFT run on OUT/base")
    convert.add_argument("--merge", default=None,
                         help="a PEFT run directory to write as a plain full checkpoint (LoRA merged into its base)")
    convert.add_argument("--preset", default=None, help="model preset, for runs without model_config.json")
    convert.add_argument("--quantize", default=None, choices=["int8", "int4"],
                         help="write a weight-only quantised run (int8: kernels and tables with per-output-channel "
                              "scales; int4: packed int4 kernels, scales per 128 inputs) of --from_hf HF_DIR or "
                              "--from_run RUN_DIR")
    convert.add_argument("--from_run", default=None, help="with --quantize: a t5lite run directory to quantise")
    convert.add_argument("--from_elmo", default=None, help="an original ELMo weights .hdf5 to import as a t5lite run")
    convert.add_argument("--elmo_options", default=None, help="with --from_elmo: its options.json")
    convert.add_argument("--to_elmo", default=None,
                         help="a t5lite ELMo run to write as OUT/options.json + OUT/weights.hdf5")
    convert.set_defaults(fn=cmd_convert)
    tasks = sub.add_parser("tasks", parents=[common], help="list tasks or show preprocessed examples of one")
    tasks.add_argument("action", choices=["list", "show"])
    tasks.add_argument("name", nargs="?")
    tasks.add_argument("--split", default="train")
    tasks.add_argument("--data_dir", default=None)
    tasks.add_argument("-n", "--num_examples", type=int, default=3)
    tasks.add_argument("--sequence_length", default="inputs=512,targets=114",
                       help="feature lengths for preprocessing, e.g. inputs=512,targets=114")
    tasks.set_defaults(fn=cmd_tasks)
    prep = sub.add_parser("prepare", parents=[common],
                          help="clean and de-duplicate raw text (C4's rules) into ArrayRecord shards + manifest.json")
    prep.add_argument("--input", nargs="+", required=True,
                      help="files or globs: JSON lines with `text` (and `url`), or plain text (one document per "
                           "file); .gz is decompressed, e.g. 'crawl/*.jsonl.gz'")
    prep.add_argument("--output", required=True, help="a new or empty folder (or an unfinished one, to resume)")
    prep.add_argument("--workers", type=int, default=1, help="worker processes (one input file at a time each)")
    prep.add_argument("--split", default="train", help="the split name the shards and manifest carry")
    prep.add_argument("--bad_words", default=None, help="a file of words or phrases, one per line: pages with one go")
    prep.add_argument("--min_words", type=int, help="words a line needs to be kept (default C4's 5)")
    prep.add_argument("--min_sentences", type=int, help="sentences a page needs to be kept (default C4's 3)")
    prep.add_argument("--max_page_length", type=int,
                      help="pages with more characters go (default C4's 190000)")
    prep.add_argument("--no_language_filter", action="store_true", help="keep pages in any language")
    prep.set_defaults(fn=cmd_prepare)
    compile_ = sub.add_parser("compile", parents=[common], help="compile the train step (or infer's decoding) for a TPU slice on "
                                              "this machine: memory, FLOPs, collectives (needs the `tpu` extra)")
    compile_.add_argument("--mode", choices=["train", "infer"], default="train",
                          help="train: `t5lite train`'s step (gin as for train); infer: `t5lite infer`'s decoding "
                               "of one batch (gin: infer.model, infer.batch_size, infer.max_input_length, "
                               "infer.max_decode_length, infer.method)")
    compile_.add_argument("--topology", required=True,
                          help="TPU slice: a shape (v5e:2x2, v5e:4x4, v4:2x2x4) or an accelerator type (v4-32, v5p-64)")
    compile_.add_argument("--num_slices", type=int, default=1, help="slices joined over DCN (data axis)")
    compile_.set_defaults(fn=cmd_compile)
    analysis = argparse.ArgumentParser(add_help=False)
    analysis.add_argument("--model", required=True,
                          help="a Hugging Face model folder (config.json + weights + tokenizer) or a t5lite run / "
                               "checkpoint directory")
    analysis.add_argument("--vocabulary", default=None,
                          help="the model's vocabulary file, if its folder or run does not record one")
    analysis.add_argument("--name", default=None, help="the model's name in the results (default: its folder's)")
    analysis.add_argument("--data_dir", default=None,
                          help="the folder with en_ewt/*.conllu (UD English-EWT) and uner_en_ewt/*.iob2")
    analysis.add_argument("--out", required=True, help="the folder to write the JSON and PNG into")
    probe = sub.add_parser("probe", parents=[common, analysis],
                           help="per-layer linear (POS, NER) and structural (dependency distance) probes of a frozen "
                                "model against its untrained control; or, with --neighbours, a word's contextual "
                                "nearest neighbours")
    probe.add_argument("--probes", default="pos,structural",
                       help="comma-separated: pos, ner, ner_spans (entity type of each gold span), structural")
    probe.add_argument("--span_pooling", default="mean", choices=["mean", "endpoint"],
                       help="ner_spans: a span's vector is its subwords' mean or [first; last]")
    probe.add_argument("--train_sentences", type=int, default=500, help="sentences the probes train on")
    probe.add_argument("--test_sentences", type=int, default=200, help="sentences the probes are scored on")
    probe.add_argument("--rank", type=int, default=32, help="the structural probe's rank k")
    probe.add_argument("--epochs", type=int, default=30, help="the structural probe's epochs")
    probe.add_argument("--l2", type=float, default=1e-3, help="the linear probes' L2 weight")
    probe.add_argument("--no_control", action="store_true", help="skip the untrained control model")
    probe.add_argument("--seed", type=int, default=0, help="the control's initialisation and the probes' seed")
    probe.add_argument("--neighbours", default=None, metavar="WORD",
                       help="instead of probing: each occurrence of WORD in --corpus and its nearest neighbours")
    probe.add_argument("--corpus", default=None,
                       help="with --neighbours: a CoNLL-U file or plain text (sentences cut after . ! ?)")
    probe.add_argument("--corpus_sentences", type=int, default=None, help="with --neighbours: read only this many")
    probe.add_argument("--layer", type=int, default=-1,
                       help="with --neighbours: the layer (0 = embeddings, negative from the top)")
    probe.add_argument("--k", type=int, default=5, help="with --neighbours: neighbours per occurrence")
    probe.add_argument("--pool", default="same", choices=["same", "all"],
                       help="with --neighbours: among the word's other occurrences, or among all words")
    probe.set_defaults(fn=cmd_probe)
    attention = sub.add_parser("attention", parents=[common, analysis],
                               help="per-head attention statistics (Clark et al. 2019), dependency heads and "
                                    "heatmaps of a frozen model on UD sentences")
    attention.add_argument("--split", default="dev", choices=["train", "dev", "test"], help="the UD split to read")
    attention.add_argument("--sentences", type=int, default=200, help="the first N sentences of the split")
    attention.add_argument("--example", type=int, default=0, help="which of them the heatmaps show")
    attention.set_defaults(fn=cmd_attention)
    sweep = sub.add_parser("sweep", parents=[common], help="run a grid of pre-train + fine-tune cells over seeds "
                                                            "(--gin_file=configs/sweeps/NAME.gin) and report them")
    sweep.add_argument("--out", required=True, help="the sweep's folder: a run directory per cell and seed, report.md")
    sweep.add_argument("--parallel", type=int, default=None,
                       help="cells run at once (default: the scale's `parallel`)")
    sweep.set_defaults(fn=cmd_sweep)
    return parser


def configure_jax() -> None:
    """Compiled programs cached on disk (a resumed or repeated run skips XLA's compile), the CPU alone
    on a machine without accelerators unless JAX_PLATFORMS says otherwise (t5lite.platforms), and on
    a multi-host slice (T5LITE_DISTRIBUTED=1, set by tpu_scripts/run.sh) joining the other hosts."""
    import jax
    from t5lite.data.vocab import default_cache_dir
    chosen = platforms.default_platforms()
    if chosen:
        jax.config.update("jax_platforms", chosen)
    if not jax.config.jax_compilation_cache_dir:
        jax.config.update("jax_compilation_cache_dir", os.path.join(default_cache_dir(), "jax"))
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    if os.environ.get("T5LITE_DISTRIBUTED") == "1":
        jax.distributed.initialize()


def main(argv: list[str] | None = None) -> None:
    """Runs a command. A `T5liteError` (the user's input at fault) prints as one message with exit
    code 2, its traceback only with --debug or T5LITE_DEBUG=1; anything else is a bug and keeps its
    traceback (exit code 1)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv or os.environ.get("T5LITE_DEBUG", "") not in ("", "0")
    try:
        gin_files, gin_bindings, rest = split_gin_flags(argv)
        args = build_parser().parse_args(rest)
        configure_jax()
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        for noisy in ("absl", "orbax", "jax", "fsspec", "gcsfs"):  # gcsfs: gs:// paths without TensorFlow
            logging.getLogger(noisy).setLevel(logging.WARNING)
        args.fn(args, gin_files, gin_bindings)
    except T5liteError as e:
        if debug:
            traceback.print_exc()
        print(f"t5lite: error: {user_message(e)}", file=sys.stderr)
        raise SystemExit(2) from None


def user_message(error: BaseException) -> str:
    """The error's message without the "In call to configurable ..." lines gin appends."""
    return "\n".join(line for line in str(error).splitlines()
                     if not line.strip().startswith("In call to configurable")).strip()


if __name__ == "__main__":
    main()
