"""`t5lite probe` and `t5lite attention`: the two commands that analyse a frozen model on UD sentences."""
from __future__ import annotations

from t5lite import writable
from t5lite.errors import ConfigError


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
