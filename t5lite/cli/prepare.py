"""`t5lite prepare`."""
from __future__ import annotations

import argparse
import logging
import os

from t5lite.cli.inputs import nonnegative_int, positive_float, positive_int
from t5lite.errors import ConfigError


def add_parser(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The `t5lite prepare` subcommand and its flags."""
    parser = subparsers.add_parser("prepare", parents=[common],
                                   help="clean and de-duplicate raw text (C4's rules) into ArrayRecord shards + "
                                        "manifest.json")
    parser.add_argument("--input", nargs="+", default=[],
                        help="files or globs: JSON lines with `text` (and `url`), or plain text (one document per "
                             "file); .gz is decompressed, e.g. 'crawl/*.jsonl.gz'")
    parser.add_argument("--task", nargs="+", default=[], metavar="NAME[:SPLIT]=DATA_DIR",
                        help="registered tasks whose text, without labels, joins the corpus (task-adaptive "
                             "pre-training), one document per record, e.g. glue_sst2=data/glue "
                             "squad_v1:validation=data/squad; the split defaults to train. C4's filters for "
                             "crawled pages skip them; line de-duplication does not")
    parser.add_argument("--output", required=True, help="a new or empty folder (or an unfinished one, to resume)")
    parser.add_argument("--workers", type=positive_int, default=1,
                        help="worker processes (one input file at a time each)")
    parser.add_argument("--split", default="train", help="the split name the shards and manifest carry")
    parser.add_argument("--bad_words", default=None, help="a file of words or phrases, one per line: pages with one go")
    parser.add_argument("--min_words", type=nonnegative_int, help="words a line needs to be kept (default C4's 5)")
    parser.add_argument("--min_sentences", type=nonnegative_int,
                        help="sentences a page needs to be kept (default C4's 3)")
    parser.add_argument("--max_page_length", type=positive_int,
                        help="pages with more characters go (default C4's 190000)")
    parser.add_argument("--no_language_filter", action="store_true", help="keep pages in any language")
    vocabulary = parser.add_argument_group(
        "a shared vocabulary instead of cleaning (XLM): --input is one text file per language, one sentence a line, "
        "named by its language (train.en train.de); writes OUTPUT/spm.model and OUTPUT/languages.json")
    vocabulary.add_argument("--vocab_size", type=positive_int, help="learn a SentencePiece vocabulary of this many pieces")
    vocabulary.add_argument("--alpha", type=positive_float, default=0.5,
                            help="with --vocab_size: XLM's smoothing of the languages' sentence shares (default 0.5)")
    vocabulary.add_argument("--sentences", type=positive_int,
                            help="with --vocab_size: sentences to sample in all (default: as many as the files hold)")
    parser.set_defaults(fn=cmd_prepare)


def cmd_vocabulary(args) -> None:
    """`t5lite prepare --vocab_size`: one vocabulary for several languages, their sentences sampled as XLM's."""
    import glob
    from t5lite.data import multilingual_vocab
    paths = [path for pattern in args.input for path in (sorted(glob.glob(pattern)) or [pattern])]
    summary = multilingual_vocab.train(paths, args.output, args.vocab_size, args.alpha, args.sentences)
    for language, counts in summary["languages"].items():
        print(f"{language}: {counts['sentences']} sentences (share {counts['share']:.3f}), sampled "
              f"{counts['sampled']} ({counts['sampled'] / summary['sentences_sampled']:.3f}, alpha={args.alpha})")
    print(f"wrote {args.output}/{multilingual_vocab.MODEL_FILE} ({args.vocab_size} pieces); train with "
          f"--gin.train.vocabulary_path=\"'{args.output}/{multilingual_vocab.MODEL_FILE}'\"")


def cmd_prepare(args, gin_files, gin_bindings) -> None:
    if args.vocab_size:
        if args.task or not args.input:
            raise ConfigError("t5lite prepare --vocab_size: give --input with one text file per language (no --task)")
        return cmd_vocabulary(args)
    import shlex
    from t5lite.data import prepare, task_documents
    if not args.input and not args.task:
        raise ConfigError("t5lite prepare: give --input FILES, --task NAME=DATA_DIR, or both")
    given = {"min_words_per_line": args.min_words, "min_num_sentences": args.min_sentences,
             "max_page_length": args.max_page_length}
    options = prepare.Options(**{k: v for k, v in given.items() if v is not None},
                              language_filter=not args.no_language_filter and _have_langdetect(),
                              bad_words=prepare.read_bad_words(args.bad_words) if args.bad_words else ())
    flags = (["--input", *args.input] if args.input else []) + (["--task", *args.task] if args.task else [])
    flags += ["--output", args.output]
    for name in ("split", "bad_words", "min_words", "min_sentences", "max_page_length"):
        if getattr(args, name) not in (None, "train"):
            flags += [f"--{name}", str(getattr(args, name))]
    flags += ["--no_language_filter"] if args.no_language_filter else []
    inputs = [*args.input, *(task_documents.PREFIX + task for task in args.task)]
    manifest = prepare.prepare(inputs, args.output, workers=args.workers, options=options, split=args.split,
                               command=shlex.join(["t5lite", "prepare", *flags]))
    counts = manifest["counts"]
    print(" ".join(f"{k}={v}" for k, v in counts.items() if v))
    output = args.output.rstrip("/")
    data_dir = os.path.dirname(output) if os.path.basename(output) == args.split else output
    print(f"kept {counts['documents_kept']} of {counts['documents_in']} documents in {len(manifest['shards'])} "
          f"shard(s) in {args.output}; train on them with data_dir={data_dir or '.'}")


def _have_langdetect() -> bool:
    """Language id runs when `langdetect` (the `c4` extra) is installed; without it, a warning says so."""
    import importlib.util
    if importlib.util.find_spec("langdetect"):
        return True
    logging.getLogger("t5lite.prepare").warning(
        "langdetect is not installed (pip install 't5lite[c4]'): the English filter is off for this run")
    return False
