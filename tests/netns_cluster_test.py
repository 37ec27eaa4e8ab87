"""Process story (issue 37): a cluster on one machine, partitioned.

deploy/netns-cluster.sh makes network namespaces for a broker host, two
worker hosts (every stage on each) and a client host, joined by veth pairs
and a bridge in a namespace of its own, each host with its own CURVE key and
the tokpipe.yaml deploy/host-config.sh renders for a real host. Jobs from the
client host (greedy and seeded, generated concurrently) must equal `tokpipe
run`. A worker host's bridge port is taken down mid-job (no FIN, no RST:
its packets are simply lost) at a seeded point for longer than the heartbeat
liveness window: no token lost, corrupted or duplicated at a subscriber, the
host's late messages refused and counted when the link comes back, and the
host registers again. A flap shorter than the heartbeat interval moves
nothing. The schedule comes from one seed, printed; TP_NETNS_SEED=N
replays it.

Needs root and iproute2 (`ip netns`), as CI has; otherwise every test is
skipped saying why."""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.abspath(os.environ.get("TP_BIN_DIR", os.path.join(ROOT, "bin")))
MODELS = os.path.abspath(os.environ.get("TP_MODELS", os.path.join(ROOT, "..", "shared", "models")))
MODEL = os.path.join(MODELS, "stories260K.bin")
TOKENIZER = os.path.join(MODELS, "tok512.bin")
SCRIPT = os.path.join(ROOT, "deploy", "netns-cluster.sh")
TAG = "tpn-t%d" % os.getpid()
HOSTS = ["w1", "w2"]
STAGES = ["tokenize", "forward", "sample", "stop"]
HEARTBEAT_S, LIVENESS = 1.0, 3   # config/tokpipe.yaml's defaults, which the cluster keeps
WAIT_S = 60                       # hang detectors, not speed limits (ASan, loaded machine)
JOB = ["--max-tokens", "300", "--ignore-eos"]
GREEDY = ["--temperature", "0"]
SEEDED = ["--temperature", "0.9", "--top-k", "40", "--seed", "4242"]


def why_no_netns():
    """None when this process may make network namespaces, else why not."""
    if os.geteuid() != 0:
        return "needs root to make network namespaces (CI runs as root)"
    if not shutil.which("ip"):
        return "needs ip (iproute2): scripts/install-deps.sh installs it"
    probe = "%s-probe" % TAG
    p = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=30)
    if p.returncode:
        return "ip netns add failed: %s" % p.stderr.strip()
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=30)
    return None


def remove_leftovers():
    """Namespaces an earlier run of this test left (its process gone)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    for pid in sorted({int(m) for m in re.findall(r"^tpn-t(\d+)-", out, re.M)}):
        if pid != os.getpid() and not os.path.exists("/proc/%d" % pid):
            cluster("down", tag="tpn-t%d" % pid)


def cluster(*args, tag=TAG, check=True, timeout=WAIT_S + 30, **kw):
    env = dict(os.environ, TPN_TAG=tag, TPN_DIR=Cluster.dir or "/tmp/" + tag, TPN_BIN=BIN,
               TPN_MODEL=MODEL, TPN_TOKENIZER=TOKENIZER)
    return subprocess.run([SCRIPT] + list(args), env=env, check=check, timeout=timeout,
                          capture_output=True, text=True, **kw)


def cluster_popen(*args, **kw):
    env = dict(os.environ, TPN_TAG=TAG, TPN_DIR=Cluster.dir, TPN_BIN=BIN)
    return subprocess.Popen([SCRIPT] + list(args), env=env, text=True, **kw)


def stats():
    out = cluster("exec", "client", os.path.join(BIN, "tokpipe"), "stats", "--json", "--timeout", "3000",
                  "--config", os.path.join(Cluster.dir, "client", "tokpipe.yaml")).stdout
    return json.loads(out)


def reference(prompts, opts):
    """`tokpipe run` of the same jobs, in this process's own namespace."""
    args = [os.path.join(BIN, "tokpipe"), "run", "--model", MODEL, "--tokenizer", TOKENIZER, "--json"]
    for p in prompts:
        args += ["--prompt", p]
    out = subprocess.run(args + JOB + opts, capture_output=True, text=True, check=True, timeout=WAIT_S).stdout
    return [json.loads(line) for line in out.splitlines()]


class Batch:
    """Greedy and seeded jobs from the client host, two `tokpipe generate`
    at once, with a `tokpipe watch` subscriber seeing every event."""

    def __init__(self, n):
        self.prompts = {"greedy": ["Greedy %d: once upon a time" % i for i in range(n)],
                        "seeded": ["Seeded %d: the little dog" % i for i in range(n)]}
        self.opts = {"greedy": GREEDY, "seeded": SEEDED}

    def start(self):
        cfg = os.path.join(Cluster.dir, "client", "tokpipe.yaml")
        self.watch_out = tempfile.TemporaryFile("w+")
        self.watch = cluster_popen("exec", "client", os.path.join(BIN, "tokpipe"), "watch", "--json",
                                   "--config", cfg, stdout=self.watch_out, stderr=subprocess.DEVNULL)
        time.sleep(1.0)   # its subscription reaches the broker before any job
        self.gen = {}
        for kind, prompts in self.prompts.items():
            args = ["generate", "--json", "--timeout", "20000"]
            for p in prompts:
                args += ["--prompt", p]
            self.gen[kind] = cluster_popen(*(args + JOB + self.opts[kind]), stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE)

    def running(self):
        return all(g.poll() is None for g in self.gen.values())

    def finish(self, test):
        """Every job equals `tokpipe run`, and the subscriber saw each job's
        events once each, in order, nothing missing (seq 0..n, the ids
        adding up to the tokens)."""
        results = {}
        for kind, g in self.gen.items():
            out, err = g.communicate(timeout=WAIT_S)
            test.assertEqual(g.returncode, 0, "%s generate failed: %s" % (kind, err))
            results[kind] = (g.pid, [json.loads(line) for line in out.splitlines()])
        time.sleep(0.5)
        self.watch.terminate()
        self.watch.wait(timeout=10)
        self.watch_out.seek(0)
        events = {}
        for line in self.watch_out:
            e = json.loads(line)
            events.setdefault(e["job_id"], []).append(e)
        self.watch_out.close()
        for kind, (pid, got) in results.items():
            want = reference(self.prompts[kind], self.opts[kind])
            test.assertEqual(len(got), len(want), kind)
            for i, (g, w) in enumerate(zip(got, want)):
                for k in ["text", "tokens", "finish_reason", "completion_tokens"]:
                    test.assertEqual(g[k], w[k], "%s job %d: %s differs from tokpipe run" % (kind, i, k))
                ids = [j for j in events if j.startswith("g-%d-" % pid) and j.endswith("-%d" % i)]
                test.assertEqual(len(ids), 1, "%s job %d: the subscriber saw jobs %s" % (kind, i, ids))
                seqs = [e["seq"] for e in events[ids[0]]]
                test.assertEqual(seqs, list(range(len(seqs))),
                                 "%s job %d: events lost, repeated or out of order" % (kind, i))
                test.assertEqual(events[ids[0]][-1]["event"], "finish", "%s job %d" % (kind, i))
                toks = [t for e in events[ids[0]] if e["event"] == "token" for t in e["ids"]]
                test.assertEqual(toks, w["tokens"], "%s job %d: the subscriber's tokens" % (kind, i))


def wait_rejoined(test, lost_before):
    """Every stage has a worker on each host again; returns the stats."""
    t0 = time.time()
    while time.time() - t0 < WAIT_S:
        s = stats()
        if all(s["workers"].get(st, 0) == len(HOSTS) for st in STAGES) and s["workers_lost"] > lost_before:
            return s
        time.sleep(0.25)
    test.fail("the cut host did not register again within %d s: %s" % (WAIT_S, s["workers"]))


class Cluster(unittest.TestCase):
    dir = None

    @classmethod
    def setUpClass(cls):
        why = why_no_netns()
        if why:
            raise unittest.SkipTest(why)
        seed = os.environ.get("TP_NETNS_SEED")
        cls.seed = int(seed) if seed else random.SystemRandom().randrange(1 << 31)
        print("netns_cluster_test: seed %d (TP_NETNS_SEED=%d replays the cut schedule)" % (cls.seed, cls.seed),
              file=sys.stderr)
        remove_leftovers()
        cls.tmp = tempfile.TemporaryDirectory(prefix="tpn-")
        Cluster.dir = cls.tmp.name

        def on_term(signum, frame):   # run-tests.sh's timeout: leave no namespace behind
            cluster("down", check=False)
            os._exit(128 + signum)
        signal.signal(signal.SIGTERM, on_term)
        try:
            cluster("up")
        except subprocess.CalledProcessError as e:
            cluster("down", check=False)
            raise AssertionError("netns-cluster.sh up failed: %s%s" % (e.stdout, e.stderr))

    @classmethod
    def tearDownClass(cls):
        cluster("down", check=False)
        cls.tmp.cleanup()

    def logs(self):
        return cluster("status", check=False).stdout

    def test_jobs_through_the_cluster_equal_tokpipe_run(self):
        b = Batch(4)
        b.start()
        b.finish(self)

    def test_worker_host_cut_mid_job_loses_nothing_and_rejoins(self):
        rng = random.Random(self.seed)
        host, delay, length = rng.choice(HOSTS), rng.uniform(0.05, 0.4), rng.uniform(3.8, 4.8)
        print("netns_cluster_test: cut %s %.2f s after submitting, for %.2f s" % (host, delay, length),
              file=sys.stderr)
        before = stats()
        b = Batch(8)
        b.start()
        time.sleep(delay)
        cluster("cut", host)
        self.assertTrue(b.running(), "the jobs ended before the link went down: nothing was mid-job")
        try:
            time.sleep(length)
        finally:
            cluster("restore", host)
        b.finish(self)
        after = wait_rejoined(self, before["workers_lost"])
        lost = after["workers_lost"] - before["workers_lost"]
        moved = sum(after["recovered_" + st] - before["recovered_" + st] for st in STAGES)
        refused = {k: after.get(k, 0) - before.get(k, 0) for k in ["replies_refused", "events_refused"]}
        print("netns_cluster_test: %d workers lost, %d jobs moved, late messages refused %s"
              % (lost, moved, refused), file=sys.stderr)
        self.assertGreaterEqual(lost, len(STAGES), "the cut host's workers were not declared lost")
        self.assertGreater(moved, 0, "the cut came after every job had finished: nothing was mid-job")
        self.assertGreater(sum(refused.values()), 0,
                           "no late message of the cut host was refused and counted: %s" % refused)

    def test_flap_shorter_than_the_heartbeat_moves_nothing(self):
        rng = random.Random(self.seed + 1)
        host, delay, length = rng.choice(HOSTS), rng.uniform(0.05, 0.4), rng.uniform(0.2, 0.8) * HEARTBEAT_S
        print("netns_cluster_test: flap %s %.2f s after submitting, for %.2f s" % (host, delay, length),
              file=sys.stderr)
        before = stats()
        b = Batch(8)
        b.start()
        time.sleep(delay)
        cluster("cut", host)
        self.assertTrue(b.running(), "the jobs ended before the link went down: nothing was mid-job")
        try:
            time.sleep(length)
        finally:
            cluster("restore", host)
        b.finish(self)
        after = stats()
        for k in ["workers_lost", "replies_refused", "events_refused"] + ["recovered_" + s for s in STAGES]:
            self.assertEqual(after.get(k, 0), before.get(k, 0), "a %.2f s flap changed %s" % (length, k))


if __name__ == "__main__":
    unittest.main()
