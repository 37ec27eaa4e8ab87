"""Structured output end to end, through the real daemon (one process per
stage, and forward,sample fused) and against `tokpipe run` in process:
GBNF-constrained jobs on stories260K and on a random-weight model with the
real Qwen3 vocabulary give outputs the grammar accepts (checked by an
independent Python regex of the same language), greedy and seeded jobs give
the same tokens in run and through the daemon whatever else is in the
batch, the grammar's end finishes a job as eos / detail grammar, FINISH says
grammar_complete (false after max_tokens or a stop string inside the
document), bad grammars and two constraints at once are refused with 400
naming the field, and a sample worker killed mid-document is replaced
without changing a token."""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import msgpack  # noqa: E402
import tpdaemon  # noqa: E402
from tpdaemon import MODELS, TOKPIPE, TOKPIPED  # noqa: E402

MODEL = tpdaemon.STORIES
TOKENIZER = tpdaemon.TOK512
PROMPT = "Once upon a time"

# A record as a schema compiler writes one, and the same language as a regex.
RECORD = ('root ::= "{" ws "\\"name\\":" ws "\\"" [a-zA-Z ]{1,12} "\\"," ws "\\"age\\":" ws age '
          '("," ws "\\"tags\\":" ws "[" ws (tag ("," ws tag){0,2})? ws "]")? ws "}"\n'
          'age ::= [0-9] | [1-9] [0-9]\n'
          'tag ::= "\\"" [a-z]{1,6} "\\""\n'
          'ws ::= | " " | "\\n" [ ]{0,4}\n')
WS = r'(?: |\n {0,4})?'
RECORD_RE = re.compile(r'\{' + WS + r'"name":' + WS + r'"[a-zA-Z ]{1,12}",' + WS + r'"age":' + WS +
                       r'(?:[0-9]|[1-9][0-9])(?:,' + WS + r'"tags":' + WS + r'\[' + WS +
                       r'(?:"[a-z]{1,6}"(?:,' + WS + r'"[a-z]{1,6}"){0,2})?' + WS + r'\])?' + WS + r'\}')


class Daemon(tpdaemon.Daemon):
    """Ready, with a SUB to every event."""

    def __init__(self, extra="", model=MODEL, tokenizer=TOKENIZER):
        super().__init__(extra, model=model, tokenizer=tokenizer, prefix="tp-grammar-", stop_timeout_s=20,
                         ready=True, sub_all=True)
        self.n_jobs = 0
        self.events_of, self.done = {}, {}

    def send(self, params, prompt=PROMPT):
        """SUBMIT only: (job id, ACK)."""
        self.n_jobs += 1
        job_id = "gr-%d-%d" % (os.getpid(), self.n_jobs)
        _, ack, _ = self.call(tpdaemon.CMD_SUBMIT, {"job_id": job_id, "params": params, "prompt": prompt})
        return job_id, ack

    def result(self, job_id, timeout_s=120):
        """(ids, text, FINISH) of job_id; events of other jobs read on the
        way are kept for their own turn."""
        end = time.time() + timeout_s
        while job_id not in self.done and time.time() < end:
            if not self.sub.sock.poll(200):
                continue
            f = self.sub.sock.recv_multipart()
            if f[0].startswith(b"@"):
                continue
            job = f[0].decode()
            hdr = msgpack.unpackb(f[3])
            ev = self.events_of.setdefault(job, [[], []])
            if f[2] == b"\x01":
                ev[0].extend(tpdaemon.ids_of(f[4]))
                ev[1].append(hdr["text"])
            else:
                ev[1].append(hdr["text"])
                self.done[job] = hdr
        self.assertTrue(job_id in self.done, "no FINISH for %s\n%s" % (job_id, self.log_text()))
        ids, texts = self.events_of.pop(job_id)
        return ids, "".join(texts), self.done.pop(job_id)

    def assertTrue(self, cond, msg):
        if not cond:
            raise AssertionError(msg)

    def submit(self, params, prompt=PROMPT):
        job_id, ack = self.send(params, prompt)
        if ack["status"] != 200:
            return ack, None, None, None
        return (ack,) + self.result(job_id)


def write(d, name, text):
    p = os.path.join(d, name)
    with open(p, "w") as f:
        f.write(text)
    return p


def run_json(model, tokenizer, *args):
    cmd = [TOKPIPE, "run", "--model", model, "--json"] + (["--tokenizer", tokenizer] if tokenizer else [])
    out = subprocess.run(cmd + list(args), capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise AssertionError("tokpipe run %s: %s" % (args, out.stderr))
    return [json.loads(line) for line in out.stdout.splitlines()]


class Constrained(object):
    EXTRA = ""

    @classmethod
    def setUpClass(cls):
        if not os.access(TOKPIPED, os.X_OK):
            raise unittest.SkipTest("tokpiped is not built")
        cls.tmp = tempfile.mkdtemp(prefix="tp-grammar-files-")
        cls.gfile = write(cls.tmp, "record.gbnf", RECORD)
        cls.d = Daemon(cls.EXTRA)

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()

    def test_outputs_follow_the_grammar_and_match_tokpipe_run(self):
        for seed in range(6):
            temp = "0" if seed == 0 else "1.0"
            ack, ids, text, fin = self.d.submit({"grammar": RECORD, "seed": seed, "temperature": float(temp),
                                                 "max_tokens": 120})
            self.assertEqual(ack["status"], 200, ack)
            ref = run_json(MODEL, TOKENIZER, "--prompt", PROMPT, "--grammar", self.gfile, "--seed", str(seed),
                           "--temperature", temp, "--max-tokens", "120")[0]
            self.assertEqual(ids, ref["tokens"], "seed %d: daemon and run differ" % seed)
            self.assertEqual(text, ref["text"])
            self.assertTrue(RECORD_RE.fullmatch(text), "seed %d: %r is not a record" % (seed, text))
            self.assertEqual((fin["reason"], fin.get("detail"), fin["grammar_complete"]), ("eos", "grammar", True))
            self.assertEqual((ref["finish_reason"], ref["finish_detail"], ref["grammar_complete"]),
                             ("eos", "grammar", True))

    def test_a_constrained_job_gives_the_same_tokens_beside_others_in_the_batch(self):
        alone = self.d.submit({"grammar": RECORD, "seed": 77, "temperature": 0.8, "max_tokens": 120})
        jobs = [self.d.send({"seed": 5 + k, "max_tokens": 60}) for k in range(3)]
        mine = self.d.send({"grammar": RECORD, "seed": 77, "temperature": 0.8, "max_tokens": 120})
        jobs.append(self.d.send({"json_mode": False, "seed": 9, "max_tokens": 50}))
        for job_id, ack in jobs + [mine]:
            self.assertEqual(ack["status"], 200, ack)
        got = self.d.result(mine[0])
        for job_id, _ in jobs:
            self.d.result(job_id)
        self.assertEqual(got[0], alone[1])

    def test_max_tokens_leaves_a_valid_prefix_and_says_incomplete(self):
        # the same seed without the cut: a whole record that starts so
        _, whole_ids, whole, wfin = self.d.submit({"grammar": RECORD, "seed": 3, "max_tokens": 200})
        self.assertTrue(RECORD_RE.fullmatch(whole) and wfin["grammar_complete"], whole)
        ack, ids, text, fin = self.d.submit({"grammar": RECORD, "seed": 3, "max_tokens": 6})
        self.assertEqual((fin["reason"], fin["grammar_complete"]), ("length", False))
        self.assertEqual(ids, whole_ids[:6])
        self.assertTrue(whole.startswith(text) and len(text) < len(whole), (text, whole))

    def test_a_stop_string_inside_the_document_still_cuts_and_says_incomplete(self):
        ack, ids, text, fin = self.d.submit({"grammar": RECORD, "seed": 0, "temperature": 0, "stop": ['"age"']})
        self.assertEqual((fin["reason"], fin["matched"], fin["grammar_complete"]), ("stop_string", '"age"', False))
        self.assertTrue(text.startswith("{") and '"name"' in text and "age" not in text, text)

    def test_json_schema_and_json_mode_jobs_give_valid_json_and_match_run(self):
        import jsonschema
        schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10},
                                                   "age": {"type": "integer", "minimum": 0, "maximum": 120}},
                  "required": ["name", "age"], "additionalProperties": False}
        sfile = write(self.tmp, "person.json", json.dumps(schema))
        for seed in (1, 2):
            ack, ids, text, fin = self.d.submit({"json_schema": json.dumps(schema), "seed": seed, "max_tokens": 150})
            self.assertEqual(ack["status"], 200, ack)
            ref = run_json(MODEL, TOKENIZER, "--prompt", PROMPT, "--json-schema", sfile, "--seed", str(seed),
                           "--max-tokens", "150")[0]
            self.assertEqual(ids, ref["tokens"])
            self.assertEqual((fin["reason"], fin.get("detail"), fin["grammar_complete"]), ("eos", "grammar", True))
            doc = json.loads(text)
            jsonschema.validate(doc, schema)
            self.assertEqual(list(doc), ["name", "age"])   # the schema's order
        ack, ids, text, fin = self.d.submit({"json_mode": True, "seed": 3, "max_tokens": 200})
        self.assertEqual(ack["status"], 200, ack)
        if fin["grammar_complete"]:
            self.assertIsInstance(json.loads(text), dict)
        else:
            self.assertEqual(fin["reason"], "length")
            self.assertTrue(text.lstrip().startswith("{"), text)

    def test_unconstrained_jobs_have_no_grammar_keys(self):
        ack, ids, text, fin = self.d.submit({"seed": 1, "max_tokens": 5})
        self.assertNotIn("grammar_complete", fin)

    def test_bad_grammars_and_two_constraints_are_refused_naming_the_field(self):
        cases = [({"grammar": "root ::= foo"}, "params.grammar", "undefined rule foo"),
                 ({"grammar": 'root ::= "a"\nx ::= (b'}, "params.grammar", "line 2 col"),
                 ({"grammar": "root ::= root \"a\""}, "params.grammar", "left recursion"),
                 ({"grammar": RECORD, "json_mode": True}, "params.json_mode", "grammar and json_mode"),
                 ({"grammar": RECORD, "json_schema": "{}"}, "params.json_schema", "grammar and json_schema"),
                 ({"json_schema": "{not json"}, "params.json_schema", "json_schema"),
                 # token references resolve against the model's vocabulary at admission
                 ({"grammar": 'root ::= "a" <|python_tag|>'}, "params.grammar",
                  "line 1 col 14: token <|python_tag|> is not a special token of the model's vocabulary"),
                 ({"grammar": 'root ::= !<[512]>'}, "params.grammar", "token <[512]> is outside the vocabulary")]
        for params, field, words in cases:
            _, ack = self.d.send(dict(params, max_tokens=4))
            self.assertEqual(ack["status"], 400, (params, ack))
            self.assertEqual(ack["field"], field, ack)
            self.assertIn(words, ack["error"])

    def test_info_lists_the_grammar_limits(self):
        out = subprocess.run([TOKPIPE, "info", "--json", "--config", self.d.config], capture_output=True, text=True,
                             timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        lim = json.loads(out.stdout)["limits"]
        self.assertEqual((lim["max_grammar_bytes"], lim["max_grammar_rules"], lim["max_schema_depth"]),
                         (262144, 4096, 64))


class Separate(Constrained, unittest.TestCase):
    EXTRA = ""


class Fused(Constrained, unittest.TestCase):
    EXTRA = "workers:\n  fuse: [\"forward,sample\"]\n"


class Recovery(unittest.TestCase):
    def test_a_sample_worker_killed_mid_document_is_replaced_without_changing_a_token(self):
        if not os.access(TOKPIPED, os.X_OK):
            raise unittest.SkipTest("tokpiped is not built")
        # long enough that the worker is surely stopped mid-document
        long_doc = 'root ::= "{\\"story\\": \\"" [a-z ]{2000,2100} "\\"}"\n'
        params = {"grammar": long_doc, "seed": 11, "temperature": 1.0, "max_tokens": 400}
        with tempfile.TemporaryDirectory() as tmp:
            g = write(tmp, "long.gbnf", long_doc)
            ref = run_json(MODEL, TOKENIZER, "--prompt", PROMPT, "--grammar", g, "--seed", "11", "--temperature",
                           "1.0", "--max-tokens", "400")[0]
        d = Daemon("heartbeat:\n  interval_ms: 100\n  liveness: 20\nworkers:\n  respawn_init_ms: 100\n")
        try:
            old = tpdaemon.worker_pid(d.proc.pid, "sample")
            self.assertIsNotNone(old, "no sample worker found")
            job_id, ack = d.send(params)
            self.assertEqual(ack["status"], 200, ack)
            # stop the sampler at its first published token, then kill it
            sock = d.sub.sock
            while True:
                self.assertTrue(sock.poll(60000), "no event")
                f = sock.recv_multipart()
                if f[0] == job_id.encode():
                    os.kill(old, signal.SIGSTOP)
                    first = f
                    break
            os.kill(old, signal.SIGKILL)
            toks, fin = d.sub.collect(job_id, timeout_s=120)
            hdr = msgpack.unpackb(first[3])
            ids = tpdaemon.ids_of(first[4]) + [i for ev in toks for i in ev["ids"]]
            text = hdr["text"] + "".join(ev["text"] for ev in toks) + fin["text"]
            self.assertNotEqual(fin["reason"], "error", fin)
            self.assertEqual(ids, ref["tokens"])
            self.assertEqual(text, ref["text"])
            self.assertEqual(fin["grammar_complete"], False)   # max_tokens ended it mid-story
            self.assertLess(len(tpdaemon.ids_of(first[4])), 400, "the job ended before the worker was stopped")
            new = tpdaemon.worker_pid(d.proc.pid, "sample")
            self.assertNotIn(new, (None, old), "no new sample worker")
        finally:
            d.stop()


class RealVocabulary(unittest.TestCase):
    """A random-weight qwen2 model with Qwen3's 151k byte-level BPE vocabulary."""

    def test_constrained_output_on_the_qwen3_vocabulary(self):
        vocab = os.path.join(MODELS, "hf-vocab", "qwen3-vocab.gguf")
        if not os.access(TOKPIPED, os.X_OK) or not os.path.exists(vocab):
            raise unittest.SkipTest("tokpiped or the Qwen3 vocabulary is missing")
        with tempfile.TemporaryDirectory() as tmp:
            model = os.path.join(tmp, "q.gguf")
            tpdaemon.tokpipe("mkmodel", "--format", "gguf", "--arch", "qwen2", "--shape", "64x2x4x2", "--seed", "3",
                             "--out", model, "--vocab-from", vocab)
            g = write(tmp, "record.gbnf", RECORD)
            refs = [run_json(model, None, "--prompt", "Hi", "--grammar", g, "--seed", str(s), "--temperature", t,
                             "--max-tokens", "80")[0] for s, t in ((1, "0"), (2, "1.0"))]
            for r in refs:
                self.assertTrue(RECORD_RE.fullmatch(r["text"]), r["text"])
                self.assertTrue(r["grammar_complete"])
            d = Daemon(model=model, tokenizer="")
            try:
                for (s, t), r in zip(((1, 0.0), (2, 1.0)), refs):
                    ack, ids, text, fin = d.submit({"grammar": RECORD, "seed": s, "temperature": t,
                                                    "max_tokens": 80}, prompt="Hi")
                    self.assertEqual(ack["status"], 200, ack)
                    self.assertEqual(ids, r["tokens"])
                    self.assertEqual(fin["grammar_complete"], True)
                # <think> and </think> are single tokens of the vocabulary: the
                # grammar names them and the output holds those ids
                think = 'root ::= <think> [a-z ]{1,30} </think> "\\n" "ok"\n'
                ack, ids, text, fin = d.submit({"grammar": think, "seed": 4, "temperature": 1.0, "max_tokens": 80},
                                               prompt="Hi")
                self.assertEqual(ack["status"], 200, ack)
                self.assertEqual((ids[0], fin["grammar_complete"]), (151667, True), (ids, text))
                self.assertIn(151668, ids)
                self.assertTrue(re.fullmatch(r"<think>[a-z ]{1,30}</think>\nok", text), text)
                tfile = write(tmp, "think.gbnf", think)
                ref = run_json(model, None, "--prompt", "Hi", "--grammar", tfile, "--seed", "4", "--temperature",
                               "1.0", "--max-tokens", "80")[0]
                self.assertEqual(ids, ref["tokens"])
                _, ack = d.send({"grammar": 'root ::= <|python_tag|>', "max_tokens": 4}, prompt="Hi")
                self.assertEqual((ack["status"], ack["field"]), (400, "params.grammar"), ack)
                self.assertIn("token <|python_tag|> is not a special token", ack["error"])
            finally:
                d.stop()


def gguf_kv_bytes(kv, kv_types):
    """A tensorless GGUF v3 file of the metadata kv (typed as kv_types says;
    arrays as (element type, list))."""
    import struct
    scalars = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
               12: "<d"}

    def string(s):
        b = s.encode("utf-8", errors="surrogateescape")
        return struct.pack("<Q", len(b)) + b

    def value(t, v):
        if t == 8:
            return string(v)
        if t == 9:
            et, items = v
            return struct.pack("<IQ", et, len(items)) + b"".join(value(et, x) for x in items)
        return struct.pack(scalars[t], v)

    out = [b"GGUF", struct.pack("<IQQ", 3, 0, len(kv))]
    for k, v in kv.items():
        out += [string(k), struct.pack("<I", kv_types[k]), value(kv_types[k], v)]
    return b"".join(out)


class ThousandsOfControlTokens(unittest.TestCase):
    """A vocabulary with more control tokens than the first 1024 (Gemma 3's
    has some 6000 <unusedN>): Llama 2's SentencePiece vocabulary with 3000
    control tokens <unused0> ... <unused2999> appended (ids 32000 ...)."""

    N_EXTRA = 3000

    @classmethod
    def setUpClass(cls):
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
        import gguf_tiny
        src = os.path.join(MODELS, "llama.cpp-vocab", "ggml-vocab-llama-spm.gguf")
        if not os.access(TOKPIPED, os.X_OK) or not os.path.exists(src):
            raise unittest.SkipTest("tokpiped or the Llama 2 vocabulary is missing")
        g = gguf_tiny.Gguf(src)
        kv = {k: v for k, v in g.kv.items() if k.startswith("tokenizer.") or k == "general.architecture"}
        types = {k: g.kv_types[k] for k in kv}
        extra = ["<unused%d>" % i for i in range(cls.N_EXTRA)]
        cls.base = len(kv["tokenizer.ggml.tokens"])
        kv["tokenizer.ggml.tokens"] = (8, kv["tokenizer.ggml.tokens"] + extra)
        kv["tokenizer.ggml.scores"] = (6, kv["tokenizer.ggml.scores"] + [0.0] * len(extra))
        kv["tokenizer.ggml.token_type"] = (5, kv["tokenizer.ggml.token_type"] + [3] * len(extra))   # control
        cls.tmp = tempfile.TemporaryDirectory()
        vocab = os.path.join(cls.tmp.name, "many-control.gguf")
        with open(vocab, "wb") as f:
            f.write(gguf_kv_bytes(kv, types))
        cls.model = os.path.join(cls.tmp.name, "m.gguf")
        tpdaemon.tokpipe("mkmodel", "--format", "gguf", "--arch", "llama", "--shape", "64x2x4", "--seed", "5",
                         "--out", cls.model, "--vocab-from", vocab)
        cls.d = Daemon(model=cls.model, tokenizer="")

    @classmethod
    def tearDownClass(cls):
        cls.d.stop()
        cls.tmp.cleanup()

    def test_a_grammar_naming_a_control_token_past_the_first_1024_is_accepted_and_enforced(self):
        for n in (2500, self.N_EXTRA - 1):
            grammar = 'root ::= <unused%d> "ok"\n' % n
            ack, ids, text, fin = self.d.submit({"grammar": grammar, "temperature": 0, "max_tokens": 8},
                                                prompt="Hi")
            self.assertEqual(ack["status"], 200, ack)
            self.assertEqual(ids[0], self.base + n, (ids, text))
            self.assertEqual(text, "ok", (ids, text))   # control tokens add no bytes
            self.assertTrue(fin["grammar_complete"], fin)

    def test_a_grammar_naming_a_token_the_vocabulary_lacks_is_still_refused(self):
        _, ack = self.d.send({"grammar": 'root ::= <unused%d>' % self.N_EXTRA, "max_tokens": 4}, prompt="Hi")
        self.assertEqual((ack["status"], ack["field"]), (400, "params.grammar"), ack)
        self.assertIn("token <unused%d> is not a special token" % self.N_EXTRA, ack["error"])

    def test_info_lists_every_control_token(self):
        out = subprocess.run([TOKPIPE, "info", "--json", "--front", self.d.front], capture_output=True,
                             text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        info = json.loads(out.stdout)
        names = {t["piece"]: t["id"] for t in info["special_tokens"]}
        self.assertEqual(len(names), 3 + self.N_EXTRA, sorted(names)[:5])
        self.assertEqual(names["<unused%d>" % (self.N_EXTRA - 1)], self.base + self.N_EXTRA - 1)


if __name__ == "__main__":
    unittest.main()
