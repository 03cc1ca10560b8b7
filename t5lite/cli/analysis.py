"""`t5lite probe` and `t5lite attention`: the two commands that analyse a frozen model on UD sentences."""
from __future__ import annotations

import argparse

from t5lite import writable
from t5lite.cli.inputs import nonnegative_float, nonnegative_int, positive_int
from t5lite.errors import ConfigError


def add_parser(subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    """The `t5lite probe` and `t5lite attention` subcommands: the model flags they share, then each one's own."""
    model_flags = argparse.ArgumentParser(add_help=False)
    model_flags.add_argument("--model", required=True,
                             help="a Hugging Face model folder (config.json + weights + tokenizer) or a t5lite run / "
                                  "checkpoint directory")
    model_flags.add_argument("--vocabulary", default=None,
                             help="the model's vocabulary file, if its folder or run does not record one")
    model_flags.add_argument("--name", default=None, help="the model's name in the results (default: its folder's)")
    model_flags.add_argument("--data_dir", default=None,
                             help="the folder with en_ewt/*.conllu (UD English-EWT) and uner_en_ewt/*.iob2")
    model_flags.add_argument("--out", required=True, help="the folder to write the JSON and PNG into")
    probe = subparsers.add_parser("probe", parents=[common, model_flags],
                                  help="per-layer linear (POS, NER) and structural (dependency distance) probes of "
                                       "a frozen model against its untrained control; or, with --neighbours, a "
                                       "word's contextual nearest neighbours")
    probe.add_argument("--probes", default="pos,structural",
                       help="comma-separated: pos, ner, ner_spans (entity type of each gold span), structural")
    probe.add_argument("--span_pooling", default="mean", choices=["mean", "endpoint"],
                       help="ner_spans: a span's vector is its subwords' mean or [first; last]")
    probe.add_argument("--train_sentences", type=positive_int, default=500, help="sentences the probes train on")
    probe.add_argument("--test_sentences", type=positive_int, default=200, help="sentences the probes are scored on")
    probe.add_argument("--rank", type=positive_int, default=32, help="the structural probe's rank k")
    probe.add_argument("--epochs", type=positive_int, default=40,
                       help="the structural probe's most epochs (it stops early on the UD dev loss)")
    probe.add_argument("--l2", type=nonnegative_float, default=1e-3, help="the linear probes' L2 weight")
    probe.add_argument("--no_control", action="store_true", help="skip the untrained control model")
    probe.add_argument("--seed", type=nonnegative_int, default=0,
                       help="the control's initialisation and the probes' seed")
    probe.add_argument("--neighbours", default=None, metavar="WORD",
                       help="instead of probing: each occurrence of WORD in --corpus and its nearest neighbours")
    probe.add_argument("--corpus", default=None,
                       help="with --neighbours: a CoNLL-U file or plain text (sentences cut after . ! ?)")
    probe.add_argument("--corpus_sentences", type=positive_int, default=None,
                       help="with --neighbours or --parallel: read only this many")
    probe.add_argument("--layer", type=int, default=-1,
                       help="with --neighbours: the layer (0 = embeddings, negative from the top)")
    probe.add_argument("--k", type=positive_int, default=5, help="with --neighbours: neighbours per occurrence")
    probe.add_argument("--pool", default="same", choices=["same", "all"],
                       help="with --neighbours: among the word's other occurrences, or among all words")
    probe.add_argument("--cross_lingual", action="store_true",
                       help="instead of probing: English to Fake-English word retrieval (precision@1 per layer) of "
                            "a run trained on a *_fake_english_mlm task; --corpus keeps the pieces its text holds")
    probe.add_argument("--no_shared_special", action="store_true",
                       help="with --cross_lingual: the run was trained with fake_english.share_special = False")
    probe.add_argument("--no_shared_positions", action="store_true",
                       help="with --cross_lingual: the run was trained with fake_english.share_positions = False")
    probe.add_argument("--parallel", nargs=2, default=None, metavar=("FIRST", "SECOND"),
                       help="instead of probing: zero-shot sentence retrieval (XTREME's Tatoeba/BUCC) between two "
                            "aligned files, line i of SECOND translating line i of FIRST (accuracy per layer)")
    probe.add_argument("--languages", default="en,de", help="with --parallel: the two files' languages, for the results")
    probe.add_argument("--tlm", action="store_true",
                       help="with --parallel: the run was trained on a *_tlm task (sentences read as XLM's streams)")
    probe.set_defaults(fn=cmd_probe)
    attention = subparsers.add_parser("attention", parents=[common, model_flags],
                                      help="per-head attention statistics (Clark et al. 2019), dependency heads and "
                                           "heatmaps of a frozen model on UD sentences")
    attention.add_argument("--split", default="dev", choices=["train", "dev", "test"], help="the UD split to read")
    attention.add_argument("--sentences", type=positive_int, default=200, help="the first N sentences of the split")
    attention.add_argument("--example", type=nonnegative_int, default=0, help="which of them the heatmaps show")
    attention.set_defaults(fn=cmd_attention)


def _subject(args, needs: str | None):
    """The model of `t5lite probe` / `attention`, once the flag `needs` names is given and --out is writable."""
    from t5lite.analysis import loading
    if needs and not getattr(args, needs):
        raise ConfigError(f"t5lite {args.command}: give --{needs}" + (
            " DIR (the folder with en_ewt/ and uner_en_ewt/)" if needs == "data_dir" else " FILE"))
    writable.ensure_writable_dir(args.out, "--out")
    command = ("probe --neighbours" if getattr(args, "neighbours", None) else
               "probe --cross_lingual" if getattr(args, "cross_lingual", False) else args.command)
    return loading.load(args.model, args.vocabulary, args.name, command)


def cmd_probe(args, gin_files, gin_bindings) -> None:
    from t5lite.analysis import neighbours, probe, words
    if args.cross_lingual:
        from t5lite.analysis import cross_lingual
        subject = _subject(args, None)
        ids = cross_lingual.pieces(subject, args.corpus)
        result = cross_lingual.retrieval(subject, ids, not args.no_shared_special, not args.no_shared_positions)
        for layer, scores in enumerate(result["layers"]):
            print(f"layer {layer}: precision@1 English->Fake {scores['english_to_fake']:.3f}, "
                  f"Fake->English {scores['fake_to_english']:.3f} ({result['pieces']} pieces, chance "
                  f"{result['chance']:.4f})")
        print(f"wrote {cross_lingual.write(result, args.out)}")
        return
    if args.parallel:
        return _sentence_retrieval(args)
    subject = _subject(args, "corpus" if args.neighbours else "data_dir")
    if args.neighbours:
        sentences = (words.read_conll(args.corpus, args.corpus_sentences, "--corpus") if args.corpus.endswith(".conllu")
                     else words.read_text(args.corpus, args.corpus_sentences))
        result = neighbours.neighbours(subject, sentences, args.neighbours,
                                       args.layer, args.k, args.pool)
        print(f"wrote {neighbours.write(result, args.out)}")
        return
    results = probe.run(subject, args.data_dir, args.probes.split(","), args.train_sentences, args.test_sentences,
                        args.rank, args.epochs, args.l2, not args.no_control, args.seed, args.span_pooling)
    print("wrote " + ", ".join(probe.write(results, args.out)))


def _sentence_retrieval(args) -> None:
    """`t5lite probe --parallel`: each layer's retrieval accuracy between the two files, both ways."""
    from t5lite.analysis import sentence_retrieval
    languages = args.languages.split(",")
    if len(languages) != 2 or not all(languages):
        raise ConfigError(f"--languages {args.languages}: give the two files' languages, e.g. en,de")
    first, second = sentence_retrieval.read_pairs(*args.parallel, args.corpus_sentences)
    subject = _subject(args, None)
    result = sentence_retrieval.retrieval(subject, first, second, languages, args.tlm)
    forth, back = (f"{languages[1]}_to_{languages[0]}", f"{languages[0]}_to_{languages[1]}")
    for layer, scores in enumerate(result["layers"]):
        print(f"layer {layer}: accuracy {languages[1]}->{languages[0]} {scores[forth]:.3f}, "
              f"{languages[0]}->{languages[1]} {scores[back]:.3f} ({result['sentences']} sentences, chance "
              f"{result['chance']:.4f})")
    print(f"wrote {sentence_retrieval.write(result, args.out)}")


def cmd_attention(args, gin_files, gin_bindings) -> None:
    import os
    from t5lite.analysis import attention, forward
    if args.example >= args.sentences:
        raise ConfigError(f"--example {args.example}: choose one of the first --sentences {args.sentences} "
                          f"(0 to {args.sentences - 1})")
    subject = _subject(args, "data_dir")
    sentences = forward.read_fitting(subject, os.path.join(args.data_dir, f"en_ewt/en_ewt-ud-{args.split}.conllu"),
                                     args.sentences)
    results, weights = attention.analyse(subject, sentences)
    print("wrote " + ", ".join(attention.write(subject, results, weights, sentences, args.out, args.example)))
