"""`t5lite prepare`."""
from __future__ import annotations

import logging


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
