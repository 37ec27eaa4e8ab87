#!/usr/bin/env python3
"""make bench: what losing the broker costs (issue 37). The cluster of
tests/http_failover_test.py on loopback: a primary and a backup tokpiped
(Binary Star), workers that know both, tokpipe-http with both. Each round
streams STREAMS chat completions (greedy and seeded), kills the active
broker once every stream is under way, and measures from the kill:

  takeover   the peer's log says "-> active"
  workers    every stage registered with it
  stall      the longest wait of a stream for its next chunk
  resumed    streams that ended byte-identical to an undisturbed run

then starts the killed broker again (it stands down as the passive one),
and the next round kills the other: ROUNDS failovers, median and worst.
The baseline is the undisturbed run's own chunk gap (the same streams, no
kill), measured first. Figures depend on the machine's load and on
standby.failover_ms (here 2000, as in the tests): quote them with both."""
import os
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import http_failover_test as hf  # noqa: E402
import standby_test as sb  # noqa: E402

ROUNDS = int(os.environ.get("TP_BENCH_FAILOVERS", "20"))
STREAMS = 32
MAX_TOKENS = 300


def bodies():
    out = []
    for k in range(STREAMS):
        b = {"model": "stories260K", "messages": [{"role": "user", "content": hf.PROMPTS[k % len(hf.PROMPTS)]}],
             "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": True,
             "stream_options": {"include_usage": True}}
        b.update({"temperature": 0} if k % 2 == 0 else {"temperature": 0.8, "seed": 100 + k})
        out.append(b)
    return out


def worst_gap(calls, since):
    """The longest any stream waited for a chunk after `since`."""
    w = 0.0
    for c in calls:
        at = [since] + [t for t in c.chunk_at if t >= since]
        w = max([w] + [b - a for a, b in zip(at, at[1:])])
    return w


class Watch(threading.Thread):
    """From the kill on, while the streams run: when the peer's log says it
    went active, then when every stage is registered with it."""

    def __init__(self, t, peer, actives):
        super().__init__(daemon=True)
        self.t, self.peer, self.actives = t, peer, actives
        self.active_at = self.workers_at = None

    def run(self):
        end = time.time() + 30
        while time.time() < end and self.workers_at is None:
            if self.active_at is None:
                if self.peer.text().count("-> active") > self.actives:
                    self.active_at = time.time()
            elif sb.StandbyTest.all_stages(self.t, self.peer):
                self.workers_at = time.time()
            time.sleep(0.01)


def row(name, xs, unit="s"):
    print("  %-10s median %7.3f %s   worst %7.3f %s   (%d failovers)" %
          (name, statistics.median(xs), unit, max(xs), unit, len(xs)))


def main():
    if not os.access(hf.tpdaemon.TOKPIPE_HTTP, os.X_OK) or not os.path.exists(hf.TEMPLATE):
        print("bench_failover: skipped (bin/tokpipe-http not built, or no chat template in the models)")
        return 0
    t = hf.HttpFailoverTest("test_primary_killed_mid_stream_every_stream_goes_on_byte_identical")
    t.setUp()
    try:
        return run(t)
    finally:
        t.tearDown()


def run(t):
    brokers = [t.primary, t.backup]
    sb.wait_for(lambda: "-> active" in t.primary.text(), 60, "the primary active")
    sb.wait_for(lambda: "-> passive" in t.backup.text(), 60, "the backup passive")
    t.start_workers()
    sb.wait_for(lambda: sb.StandbyTest.all_stages(t, t.primary), 90, "workers at the primary")
    t.start_gateway()
    want, _ = hf.run_all(t.port, bodies=bodies())
    for c in want:
        if c.status != 200 or c.error or c.finish != "length":
            raise SystemExit("bench_failover: the undisturbed run failed: %s%s" % (c.result(), t.diag()))
    base_gap = worst_gap(want, min(c.chunk_at[0] for c in want))
    print("bench_failover: %d streams of %d tokens through tokpipe-http, stories260K, failover_ms %d, %s" %
          (STREAMS, MAX_TOKENS, sb.FAILOVER_MS, cpu()))
    print("  baseline: undisturbed, the longest wait for a chunk %.3f s" % base_gap)

    takeover, workers, stall = [], [], []
    resumed = total = 0
    active = 0
    for r in range(ROUNDS):
        dead, peer = brokers[active], brokers[1 - active]
        actives = peer.text().count("-> active")

        w = Watch(t, peer, actives)

        def kill():
            dead.kill()
            at = time.time()
            w.start()
            return at

        got, killed_at = hf.run_all(t.port, kill, bodies=bodies())
        w.join(60)
        if w.active_at is None or w.workers_at is None:
            raise SystemExit("bench_failover: round %d: no takeover within 30 s%s" % (r + 1, t.diag()))
        takeover.append(w.active_at - killed_at)
        workers.append(w.workers_at - killed_at)
        stall.append(worst_gap(got, killed_at))
        same = sum(g.result() == w.result() for g, w in zip(got, want))
        resumed += same
        total += len(got)
        print("  round %2d: killed the %s: takeover %.3f s, workers %.3f s, stall %.3f s, %d/%d streams identical" %
              (r + 1, dead.role, takeover[-1], workers[-1], stall[-1], same, len(got)), flush=True)
        # the killed one comes back and stands down; the next round kills the other
        passives = dead.text().count("-> passive")
        dead.start()
        sb.wait_for(lambda: dead.text().count("-> passive") > passives, 60, "round %d stand-down" % r)
        active = 1 - active
    row("takeover", takeover)
    row("workers", workers)
    row("stall", stall)
    print("  resumed    %d of %d streams byte-identical to the undisturbed run (%d lost or changed)" %
          (resumed, total, total - resumed))
    return 0 if resumed == total else 1


def cpu():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return "%s, %d CPUs" % (line.split(":", 1)[1].strip(), os.cpu_count())
    except OSError:
        pass
    return "%d CPUs" % os.cpu_count()


if __name__ == "__main__":
    sys.exit(main())
