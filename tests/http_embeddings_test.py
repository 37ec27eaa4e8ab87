"""POST /v1/embeddings end to end (tokpipe-http, the broker's embedding
jobs, the forward stage's pooling) against a float64 reference: the
numpy forward of tests/support/gguf_tiny.py, its final-normed hidden
states pooled and L2-normalized (gguf_tiny.embedding).

A decoder embedding model as llama.cpp reads Qwen3-Embedding's GGUF
(qwen3, qwen3.pooling_type 3 = last token, the classifier tied to the
embeddings; random weights, Qwen3's vocabulary) gives the reference's
last-token vector for its own pooling, for text and token inputs, one or
many in a request and across concurrent requests (the forward stage
batches their jobs); on stories260K's GGUF, tokpipe's `pooling` field
gives mean, last and cls; `dimensions` truncates and normalizes again,
`encoding_format: base64` is the same floats; refusals name the field.
The official openai npm client reads them (base64, its default)."""
import base64
import json
import os
import struct
import subprocess
import sys
import tempfile
import shutil
import threading
import unittest

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import gguf_tiny  # noqa: E402
import tpdaemon  # noqa: E402
from http_gateway_test import metric, post, request  # noqa: E402
from http_openai_node_test import MODULES, ensure_client  # noqa: E402
from tpdaemon import MODELS, TOKPIPE  # noqa: E402

QWEN3 = os.path.join(MODELS, "hf-vocab", "qwen3-vocab.gguf")
STORIES = os.path.join(MODELS, "stories260K.gguf")
TOL = 2e-4   # float32 forward against float64, on unit vectors


def vec(d):
    e = d["embedding"]
    if isinstance(e, str):
        b = base64.b64decode(e)
        return np.array(struct.unpack("<%df" % (len(b) // 4), b))
    return np.array(e)


class EmbeddingsOfAQwen3EmbeddingModel(tpdaemon.HttpDaemonCase):
    @classmethod
    def new_daemon(cls):
        return tpdaemon.HttpDaemon("", model=cls.model, tokenizer="", prefix="tp-emb-")

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tp-emb-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, ignore_errors=True)
        cls.model = os.path.join(cls.dir, "qwen3-embedding.gguf")
        subprocess.run([TOKPIPE, "mkmodel", "--format", "gguf", "--arch", "qwen3", "--vocab-from", QWEN3,
                        "--shape", "64x2x4", "--seed", "3", "--pooling", "last", "--out", cls.model],
                       check=True, capture_output=True, timeout=300)
        cls.ref = gguf_tiny.Model(cls.model)
        super().setUpClass()

    def embed(self, body):
        st, r, _ = post(self.port, dict({"model": "m"}, **body), path="/v1/embeddings")
        self.assertEqual(st, 200, r)
        return r

    def check(self, got, ids, pooling="last", dims=None):
        want = gguf_tiny.embedding(self.ref, ids, pooling)
        if dims:
            want = want[:dims] / np.linalg.norm(want[:dims])
        self.assertEqual(got.shape, want.shape)
        self.assertLess(np.abs(got - want).max(), TOL, (ids, pooling))

    def test_text_and_token_inputs_give_the_reference_last_token_embedding(self):
        texts = ["Weather in Paris?", "The quick brown fox jumps over the lazy dog.", "a"]
        ids = [tpdaemon.tokenize(self.model, t) for t in texts]
        r = self.embed({"input": texts})
        self.assertEqual(r["object"], "list")
        self.assertEqual([d["index"] for d in r["data"]], [0, 1, 2])
        self.assertEqual(r["usage"]["prompt_tokens"], sum(map(len, ids)))
        for d, i in zip(r["data"], ids):
            self.assertEqual(d["object"], "embedding")
            self.check(vec(d), i)
        # token arrays, one and several: the same vectors
        one = self.embed({"input": ids[1]})
        self.assertTrue(np.array_equal(vec(one["data"][0]), vec(r["data"][1])))
        many = self.embed({"input": ids})
        for a, b in zip(many["data"], r["data"]):
            self.assertTrue(np.array_equal(vec(a), vec(b)))
        # a long input: several prefill chunks
        long_ids = (ids[1] * 40)[:400]
        first = vec(self.embed({"input": long_ids})["data"][0])
        self.check(first, long_ids)
        # again: whole pages of it come from the prefix cache, the same vector
        st, m0, _ = request(self.port, "GET", "/metrics")
        again = vec(self.embed({"input": long_ids})["data"][0])
        st, m1, _ = request(self.port, "GET", "/metrics")
        hits = [metric(m.decode(), "tokpipe_prefix_cache_hit_tokens_total") for m in (m0, m1)]
        self.assertGreaterEqual(hits[1] - hits[0], 256, hits)
        self.assertLess(np.abs(again - first).max(), 1e-6)

    def test_concurrent_requests_batched_in_the_forward_stage_give_the_reference(self):
        inputs = [tpdaemon.tokenize(self.model, "Input number %d is here" % k) for k in range(12)]
        out = [None] * len(inputs)

        def one(k):
            st, r, _ = post(self.port, {"input": inputs[k]}, path="/v1/embeddings")
            out[k] = (st, r)

        threads = [threading.Thread(target=one, args=(k,)) for k in range(len(inputs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for k, (st, r) in enumerate(out):
            self.assertEqual(st, 200, r)
            self.check(vec(r["data"][0]), inputs[k])
        st, text, _ = request(self.port, "GET", "/metrics")
        self.assertGreaterEqual(metric(text.decode(), "tokpipe_http_responses_total",
                                       'endpoint="/v1/embeddings",code="2xx"'), 12)

    def test_dimensions_and_base64(self):
        ids = tpdaemon.tokenize(self.model, "Weather in Paris?")
        full = vec(self.embed({"input": ids})["data"][0])
        r = self.embed({"input": ids, "dimensions": 16, "encoding_format": "base64"})
        self.assertIsInstance(r["data"][0]["embedding"], str)
        got = vec(r["data"][0])
        self.check(got, ids, dims=16)
        self.assertLess(np.abs(got - full[:16] / np.linalg.norm(full[:16])).max(), 1e-6)

    def test_refusals_name_the_field(self):
        bad = [({"input": "x", "dimensions": 65}, 400, "dimensions"),
               ({"input": "x", "dimensions": 0}, 400, "dimensions"),
               ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
               ({"input": []}, 400, "input"),
               ({"input": [[1, 2], [-3]]}, 400, "input[1][0]"),
               ({}, 400, "input"),
               ({"input": "x", "pooling": "max"}, 400, "pooling"),
               ({"input": "x", "stream": True}, 400, "stream")]
        for body, status, param in bad:
            st, r, _ = post(self.port, body, path="/v1/embeddings")
            self.assertEqual((st, r["error"]["param"]), (status, param), (body, r))
            self.assertTrue(r["error"]["message"].startswith(param), r)

    def test_the_openai_client_reads_them(self):
        why = ensure_client()
        if why:
            self.skipTest(why)
        script = ("const OpenAI = require('openai');"
                  "const c = new OpenAI({baseURL: process.argv[1], apiKey: 'none', maxRetries: 0});"
                  "c.embeddings.create({model: 'm', input: ['Weather in Paris?', 'a']})"
                  ".then(r => console.log(JSON.stringify(r)));")
        p = subprocess.run(["node", "-e", script, "http://127.0.0.1:%d/v1" % self.port], capture_output=True,
                           text=True, timeout=120, env=dict(os.environ, NODE_PATH=MODULES))
        self.assertEqual(p.returncode, 0, p.stderr)
        r = json.loads(p.stdout)
        for d, t in zip(r["data"], ["Weather in Paris?", "a"]):
            self.check(np.array(d["embedding"]), tpdaemon.tokenize(self.model, t))


class EmbeddingsPooledAsAsked(tpdaemon.HttpDaemonCase):
    """stories260K's GGUF names no pooling: tokpipe's `pooling` field picks one."""

    @classmethod
    def new_daemon(cls):
        return tpdaemon.HttpDaemon("", model=STORIES, tokenizer="", prefix="tp-emb-stories-")

    @classmethod
    def setUpClass(cls):
        if not os.path.exists(STORIES):
            raise unittest.SkipTest("no stories260K.gguf in the models")
        cls.ref = gguf_tiny.Model(STORIES)
        super().setUpClass()

    def test_mean_last_and_cls_pooling_give_the_reference(self):
        inputs = [[1, 400, 300, 21, 7], [1] + list(range(30, 230)), [1, 9]]
        for pooling in ("mean", "last", "cls", "model"):
            st, r, _ = post(self.port, {"input": inputs, "pooling": pooling}, path="/v1/embeddings")
            self.assertEqual(st, 200, r)
            for d, ids in zip(r["data"], inputs):
                want = gguf_tiny.embedding(self.ref, ids, "last" if pooling == "model" else pooling)
                self.assertLess(np.abs(vec(d) - want).max(), TOL, (pooling, ids))
        # mean pooling again: computed whole (the cache keeps no hidden states), the same vector
        st, a, _ = post(self.port, {"input": inputs[1], "pooling": "mean"}, path="/v1/embeddings")
        st, b, _ = post(self.port, {"input": inputs[1], "pooling": "mean"}, path="/v1/embeddings")
        self.assertLess(np.abs(vec(a["data"][0]) - vec(b["data"][0])).max(), 1e-6)
        # a generating job next to embedding jobs is unchanged by them
        st, c, _ = post(self.port, {"prompt": [1, 400, 300], "max_tokens": 5, "temperature": 0}, path="/v1/completions")
        self.assertEqual(st, 200, c)
        self.assertEqual(c["usage"]["completion_tokens"], 5)


if __name__ == "__main__":
    unittest.main()
