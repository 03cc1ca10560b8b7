"""SuperGLUE reading and formatting against TFDS's and T5's own code, run in the test.

Rows in SuperGLUE's distributed layout (jsonl; DPR's release text) are written to the files t5lite
reads, and the same files are read by TFDS's builders (`super_glue.SuperGlue._generate_examples`,
with its wsc.fixed span repair, encoded by the builder's features: labels as ClassLabel ids;
`definite_pronoun_resolution`): both readers must give the same records. Those records then go
through the text preprocessors of T5's registered tasks (`t5.data.tasks`: `super_glue_<task>_v102`,
`super_glue_wsc_v102_simple_train` / `_eval`, `dpr_v001_simple`) and t5lite's tasks, which must
give the same inputs, targets and scoring fields. SuperGLUE itself is not in the shared data, so the
rows are written here, in its layout, with the cases the formats treat specially (MultiRC's HTML,
ReCoRD's @highlight lines and repeated entities, WSC's spans that TFDS repairs and the two texts T5
special-cases, the two spans TFDS's repair hard-codes, unlabelled test rows).
"""
import json

import pytest

from t5lite.data import get_task
from t5lite.data.sources import to_python

tf = pytest.importorskip("tensorflow", reason="the T5 and TFDS references need the `reference` extra")
seqio = pytest.importorskip("seqio", reason="the T5 reference needs the `reference` extra")
pytest.importorskip("t5.data.tasks", reason="T5's registered SuperGLUE tasks are the reference")
super_glue = pytest.importorskip("tensorflow_datasets.text.super_glue", reason="TFDS's SuperGLUE builder")
dpr = pytest.importorskip("tensorflow_datasets.text.definite_pronoun_resolution", reason="TFDS's DPR builder")

PONY = ('The boy continued to whip the pony , and eventually the pony threw him over. John laughed out quite loud. '
        '"Good for him," he said. ')
PEBBLE = ('When they had eventually calmed down a bit , and had gotten home, Mr. Farley put the magic pebble in an '
          'iron safe . Some day they might want to use it , but really for now, what more could they wish for?')
MARK = ("Mark told Pete many lies about himself, which Pete included in his book. He should have been more "
        "skeptical.")
# The two spans TFDS's wsc.fixed repair hard-codes (super_glue.py `_fix_wst`): a Kamenev span is kept
# as is, whatever the word at its index; a span with "theyscold" moves span2_index to 10.
KAMENEV = "Stalin slowly turned the party against Kamenev , then Zinoviev , because they had opposed him ."
SCOLD = "The children broke the vase , so the parents , theyscold them ."


def wsc(idx, text, span1, span2, label=None):
    """A WSC row: spans as (text, word index)."""
    row = {"text": text, "idx": idx, "target": {"span1_text": span1[0], "span1_index": span1[1],
                                                "span2_text": span2[0], "span2_index": span2[1]}}
    return row if label is None else {**row, "label": label}


PASSAGE = ("(CNN) -- Lionel Messi scored twice as Barcelona beat Real Madrid 3-1 at the Camp Nou on Saturday. "
           "Messi's second was his 40th strike of the season.\n@highlight\nBarcelona beat Real Madrid 3-1\n"
           "@highlight\nLionel Messi scores twice!\n@highlight\nBarcelona go top of La Liga")


def entity(name, nth=0):
    start = -1
    for _ in range(nth + 1):
        start = PASSAGE.index(name, start + 1)
    return {"start": start, "end": start + len(name) - 1}


ROWS = {
    "boolq": [
        {"question": "do iran and afghanistan speak the same language", "passage": "Persian language -- Persian "
         "(/ˈpɜːrʒən, -ʃən/), also known by its endonym Farsi, is one of the Western Iranian languages.",
         "idx": 0, "label": True},
        {"question": "is windows movie maker part of windows essentials", "passage": "Windows Movie Maker -- "
         "Windows Movie Maker is a discontinued video editing software by Microsoft.", "idx": 1, "label": False},
        {"question": "is a wolverine the same as a badger", "passage": "Wolverine -- The wolverine is the largest "
         "land-dwelling species of the family Mustelidae.", "idx": 2}],
    "cb": [
        {"premise": "It was a complex language. Not written down but handed down. One might say it was peeled down.",
         "hypothesis": "the language was peeled down", "label": "entailment", "idx": 0},
        {"premise": "B: And I don't think that's fair. A: I don't think it is either.",
         "hypothesis": "it is fair", "label": "contradiction", "idx": 1},
        {"premise": "He wondered whether she was coming.", "hypothesis": "she was coming", "label": "neutral",
         "idx": 2},
        {"premise": "Valence the void-brain, Valence the virtuous valet.", "hypothesis": "Valence was a valet",
         "idx": 3}],
    "copa": [
        {"premise": "My body cast a shadow over the grass.", "choice1": "The sun was rising.",
         "choice2": "The grass was cut.", "question": "cause", "label": 0, "idx": 0},
        {"premise": "The woman tolerated her friend's difficult behavior.", "choice1": "The woman knew her friend "
         "was going through a hard time.", "choice2": "The woman felt that her friend took advantage of her kindness.",
         "question": "cause", "label": 1, "idx": 1},
        {"premise": "The man turned on the faucet.", "choice1": "The toilet filled with water.",
         "choice2": "Water flowed from the spout.", "question": "effect", "idx": 2}],
    "multirc": [
        {"idx": 0, "version": 1.1, "passage": {
            "text": "<b>Sent 1: </b>While this process moved along, diplomacy continued its rounds.<br><b>Sent 2: </b>"
                    "Direct pressure on the Taliban had proved unsuccessful.<br>",
            "questions": [
                {"question": "What did the high-level effort to persuade Pakistan include?", "idx": 0, "answers": [
                    {"text": "Direct pressure on the Taliban", "idx": 0, "label": 0},
                    {"text": "Children, <b>Gerd</b>, or Dorian Popa", "idx": 1, "label": 1}]},
                {"question": "What continued its rounds?", "idx": 1, "answers": [
                    {"text": "Diplomacy", "idx": 2, "label": 1}]}]}},
        {"idx": 1, "version": 1.1, "passage": {
            "text": "<b>Sent 1: </b>The rally took place on October 17.<br>",
            "questions": [{"question": "When was the rally?", "idx": 2, "answers": [
                {"text": "October 17", "idx": 3}, {"text": "October 18", "idx": 4}]}]}}],
    "record": [
        {"source": "Daily mail", "idx": 0, "passage": {
            "text": PASSAGE,
            "entities": [entity("Lionel Messi"), entity("Barcelona"), entity("Real Madrid"), entity("Camp Nou"),
                         entity("Messi"), entity("Barcelona", 1), entity("La Liga")]},
         "qas": [
             {"query": "@placeholder have now won four of their last five league games.", "idx": 0, "answers": [
                 {"start": PASSAGE.index("Barcelona"), "end": PASSAGE.index("Barcelona") + 8, "text": "Barcelona"},
                 {"start": PASSAGE.rindex("Barcelona"), "end": PASSAGE.rindex("Barcelona") + 8,
                  "text": "Barcelona"}]},
             {"query": "The Argentine @placeholder was named man of the match.", "idx": 1, "answers": [
                 {"start": 7, "end": 18, "text": "Lionel Messi"},
                 {"start": PASSAGE.index("Messi's"), "end": PASSAGE.index("Messi's") + 4, "text": "Messi"}]},
             {"query": "@placeholder are the league leaders.", "idx": 2}]}],
    "rte": [
        {"premise": "No Weapons of Mass Destruction Found in Iraq Yet.",
         "hypothesis": "Weapons of Mass Destruction Found in Iraq.", "label": "not_entailment", "idx": 0},
        {"premise": "A place of sorrow, after Pope John Paul II died, became a place of celebration.",
         "hypothesis": "Pope John Paul II died.", "label": "entailment", "idx": 1},
        {"premise": "Herceptin was already approved to treat the sickest breast cancer patients.",
         "hypothesis": "Herceptin can be used to treat breast cancer.", "idx": 2}],
    "wic": [
        {"word": "place", "sentence1": "Do you want to come over to my place later?",
         "sentence2": "A political system with no place for the less prominent groups.", "idx": 0, "label": False,
         "start1": 31, "start2": 27, "end1": 36, "end2": 32, "version": 1.1},
        {"word": "beat", "sentence1": "We beat the competition.", "sentence2": "Agassi beat Becker in the tennis "
         "championship.", "idx": 1, "label": True, "start1": 3, "start2": 7, "end1": 7, "end2": 11},
        {"word": "defeat", "sentence1": "It was a narrow defeat.", "sentence2": "The army's only defeat.",
         "idx": 2, "start1": 16, "start2": 16, "end1": 22, "end2": 22}],
    "wsc.fixed": [
        wsc(0, MARK, ("Mark", 0), ("He", 13), True),
        wsc(1, MARK, ("Pete", 2), ("He", 13), False),
        wsc(2, PONY, ("the pony", 10), ("him", 22), True),
        wsc(3, PONY, ("The boy", 0), ("him", 22), False),
        wsc(4, PEBBLE, ("the magic pebble", 16), ("it", 30), True),
        # Spans that are not substrings of the text: TFDS fixes the first letter's case, a trailing
        # "." and a newline.
        wsc(5, "The trophy doesn't fit into the brown suitcase because it is too large.",
            ("the trophy.", 0), ("it", 9), True),
        wsc(6, "The trophy doesn't fit into the brown suitcase because it is too small.",
            ("The brown\nsuitcase", 5), ("it", 9), True),
        wsc(7, "Joan made sure to thank Susan for all the help she had given.", ("Susan", 5), ("she", 10)),
        wsc(8, KAMENEV, ("Kamenev and Zinoviev", 5), ("they", 12), True),
        wsc(9, SCOLD, ("the parents", 7), ("theyscold.", 11), True)],
    "axb": [
        {"sentence1": "The cat sat on the mat.", "sentence2": "The cat did not sit on the mat.",
         "label": "not_entailment", "idx": 0, "logic": "Negation"},
        {"sentence1": "When you've got no snow, it's really hard to learn a snow sport.",
         "sentence2": "When you've got snow, it's really hard to learn a snow sport.", "label": "not_entailment",
         "idx": 1, "lexical-semantics": "", "predicate-argument-structure": "", "knowledge": ""},
        {"sentence1": "Tulsi Gabbard disagrees with Bernie Sanders.", "sentence2": "Bernie Sanders disagrees with "
         "Tulsi Gabbard.", "label": "entailment", "idx": 2}],
    "axg": [
        {"premise": "The nurse notified the patient that his shift would be ending in an hour.",
         "hypothesis": "The nurse's shift would be ending in an hour.", "label": "entailment", "idx": 0,
         "pair_id": 551646},
        {"premise": "The nurse notified the patient that her shift would be ending in an hour.",
         "hypothesis": "The patient's shift would be ending in an hour.", "label": "not_entailment", "idx": 1,
         "pair_id": 551646}],
}

# t5lite's task -> (T5's task, TFDS super_glue config)
TASKS = {
    "super_glue_boolq": ("super_glue_boolq_v102", "boolq"),
    "super_glue_cb": ("super_glue_cb_v102", "cb"),
    "super_glue_copa": ("super_glue_copa_v102", "copa"),
    "super_glue_multirc": ("super_glue_multirc_v102", "multirc"),
    "super_glue_record": ("super_glue_record_v102", "record"),
    "super_glue_rte": ("super_glue_rte_v102", "rte"),
    "super_glue_wic": ("super_glue_wic_v102", "wic"),
    "super_glue_axb": ("super_glue_axb_v102", "axb"),
    "super_glue_axg": ("super_glue_axg_v102", "axg"),
    "super_glue_wsc": ("super_glue_wsc_v102_simple_eval", "wsc.fixed"),
    "super_glue_wsc_train": ("super_glue_wsc_v102_simple_train", "wsc.fixed"),
}

DPR = ("Bob asked Tom if he can lend some money.\nhe\nBob,Tom\nTom\n\n"
       "The cat chased the mouse because it was hungry.\nit\nthe cat, the mouse\nthe cat\n\n"
       "He told Paul that he, not Sam, would win.\nhe\nPaul, Sam\nPaul\n\n"
       "Sara gave Anna her keys. She had lost hers.\nShe\nSara,Anna\nAnna\n\n")


def t5_formatted(task_name, records, features):
    """The text preprocessors (those before tokenizing) of T5's registered task over TFDS's records."""
    ds = tf.data.Dataset.from_generator(lambda: iter(records), output_signature=features.get_tensor_spec())
    for preprocessor in seqio.TaskRegistry.get(task_name).preprocessors:
        if preprocessor is seqio.preprocessors.tokenize:
            break
        ds = preprocessor(ds)
    return [to_python({k: v.numpy() for k, v in ex.items()}) for ex in ds]


def assert_same_formatting(ours_name, t5_name, records, features):
    """Every field T5's task emits (`inputs`/`targets` as t5lite's `*_pretokenized`) has t5lite's value."""
    expected = t5_formatted(t5_name, records, features)
    ours = list(get_task(ours_name).preprocess(iter(records)))
    assert len(ours) == len(expected)
    for got, want in zip(ours, expected):
        named = {f"{k}_pretokenized" if k in ("inputs", "targets") else k: v for k, v in want.items()}
        assert {k: got.get(k) for k in named} == named


@pytest.mark.parametrize("ours_name", TASKS)
def test_superglue_reading_and_formatting_equal_tfds_and_t5s(ours_name, tmp_path):
    t5_name, config = TASKS[ours_name]
    task = get_task(ours_name)
    # The test split where the task has one; unlabelled rows only there (TFDS asserts that).
    split = "test" if "test" in task.source.files.split_files else "train"
    rows = [row for row in ROWS[config] if split == "test" or "label" in row or config in ("multirc", "record")]
    path = tmp_path / task.source.files.split_files[split]
    path.parent.mkdir()
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    builder = super_glue.SuperGlue(config=config, data_dir=str(tmp_path / "tfds"))
    records = [to_python(builder.info.features.encode_example(ex))
               for _, ex in builder._generate_examples(str(path), split)]
    assert list(task.source.load(split, data_dir=str(tmp_path))) == records
    assert_same_formatting(ours_name, t5_name, records, builder.info.features)


@pytest.mark.parametrize("span1, span2", [(("the trophy,", 0), ("it", 9)), (("the trophy.", 14), ("it", 9))],
                         ids=["span_not_in_text", "index_outside_text"])
def test_a_wsc_span_tfds_cannot_repair_is_refused_as_tfds_refuses_it(span1, span2, tmp_path):
    """TFDS's `_fix_wst` asserts that the repaired span is in the text (and indexes the text's words
    with the span's index); t5lite refuses the row in one line naming the file and line."""
    from t5lite.data.sources import MalformedRowError
    path = tmp_path / "WSC" / "val.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps(wsc(0, "The trophy doesn't fit into the brown suitcase because it is too large.",
                                   span1, span2, True)) + "\n", encoding="utf-8")
    builder = super_glue.SuperGlue(config="wsc.fixed", data_dir=str(tmp_path / "tfds"))
    with pytest.raises((AssertionError, IndexError)):
        list(builder._generate_examples(str(path), "validation"))
    with pytest.raises(MalformedRowError, match=r"val\.jsonl:1: bad wsc\.fixed row \(ValueError: span1_"):
        list(get_task("super_glue_wsc").source.load("validation", data_dir=str(tmp_path)))


def test_dpr_reading_and_formatting_equal_tfds_and_t5s(tmp_path):
    (tmp_path / "test.c.txt").write_text(DPR, encoding="utf-8")
    builder = dpr.DefinitePronounResolution(data_dir=str(tmp_path / "tfds"))
    records = [to_python(builder.info.features.encode_example(ex))
               for _, ex in builder._generate_examples(str(tmp_path / "test.c.txt"))]
    assert list(get_task("dpr_v001_simple").source.load("test", data_dir=str(tmp_path))) == records
    assert_same_formatting("dpr_v001_simple", "dpr_v001_simple", records, builder.info.features)
