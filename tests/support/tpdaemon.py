"""What the python integration tests share: the programs and models
scripts/run-tests.sh points at, tokpiped on a temporary config of its own,
and a JOB1 producer and an event subscriber written from protocol/PROTOCOL.md
(pyzmq + msgpack, no tokpipe code).

A test imports it by its own location, so it runs from any directory:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
    import tpdaemon  # noqa: E402
"""
import http.client
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import unittest

import msgpack
import zmq

# Resolved once: a test may change directory after importing this.
BIN = os.path.abspath(os.environ.get("TP_BIN_DIR", "bin"))
MODELS = os.path.abspath(os.environ.get("TP_MODELS", "../shared/models"))
TOKPIPE = os.path.join(BIN, "tokpipe")
TOKPIPED = os.path.join(BIN, "tokpiped")
TOKPIPE_HTTP = os.path.join(BIN, "tokpipe-http")
STORIES = os.path.join(MODELS, "stories260K.bin")
TOK512 = os.path.join(MODELS, "tok512.bin")
STAGES = ("tokenize", "forward", "sample", "stop")

CMD_SUBMIT, CMD_ACK, CMD_STATUS, CMD_STATUS_REPLY = 0x01, 0x02, 0x04, 0x05
CMD_STATS, CMD_STATS_REPLY, CMD_INFO, CMD_INFO_REPLY = 0x06, 0x07, 0x08, 0x09


def free_port():
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tokpipe(*args, timeout=300):
    """bin/tokpipe ARGS that must succeed (text output)."""
    p = subprocess.run([TOKPIPE, *args], capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError("tokpipe %s failed (%d): %s" % (" ".join(args), p.returncode, p.stderr))
    return p


def escape(text):
    """One line of `tokpipe tokenize` input for text."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t")


def tokenize(tokenizer, text, *flags):
    """The ids `tokpipe tokenize --tokenizer TOKENIZER FLAGS` gives for text."""
    p = subprocess.run([TOKPIPE, "tokenize", "--tokenizer", tokenizer, *flags],
                       input=(escape(text) + "\n").encode(), capture_output=True, timeout=60)
    assert p.returncode == 0, p.stderr.decode()
    return [int(x) for x in p.stdout.split()]


def ids_of(frame):
    """A frame of little-endian int32 token ids."""
    assert len(frame) % 4 == 0, "ids frame of %d bytes" % len(frame)
    return list(struct.unpack("<%di" % (len(frame) // 4), frame))


def logprob_frames(n, top_n, frames):
    """The lp, top_ids and top_lp frames of n tokens with top_n candidates each."""
    return {"lp": list(struct.unpack("<%df" % n, frames[0])),
            "top_ids": list(struct.unpack("<%di" % (n * top_n), frames[1])),
            "top_lp": list(struct.unpack("<%df" % (n * top_n), frames[2]))}


def stats(sock, timeout_ms):
    """One STATS on a DEALER: the reply header, or None when no reply came
    in time (or the request could not even be sent)."""
    try:
        sock.send_multipart([b"JOB1", bytes([CMD_STATS]), msgpack.packb({})])
    except zmq.Again:
        return None   # no connection was ever made
    if not sock.poll(timeout_ms):
        return None
    f = sock.recv_multipart()
    return msgpack.unpackb(f[2]) if f[1] == bytes([CMD_STATS_REPLY]) else None


class Producer:
    """DEALER to the frontend: JOB1 requests, one reply each, matched by req."""

    def __init__(self, ctx, endpoint, diag=lambda: ""):
        self.sock = ctx.socket(zmq.DEALER)
        self.sock.linger = 0
        self.sock.connect(endpoint)
        self.req = 0
        self.diag = diag  # text to show when the daemon does not answer

    def send_raw(self, frames):
        self.sock.send_multipart(frames)

    def recv(self, timeout_ms=5000):
        if not self.sock.poll(timeout_ms):
            raise AssertionError("no reply within %d ms\n%s" % (timeout_ms, self.diag()))
        frames = self.sock.recv_multipart()
        assert frames[0] == b"JOB1", frames[0]
        assert len(frames[1]) == 1
        return frames[1][0], msgpack.unpackb(frames[2]), frames[3:]

    def call(self, cmd, hdr, *payload, timeout_ms=5000):
        """(reply command, reply header, payload frames)."""
        self.req += 1
        hdr = dict(hdr, req=self.req)
        self.send_raw([b"JOB1", bytes([cmd]), msgpack.packb(hdr)] + list(payload))
        cmd, rep, pl = self.recv(timeout_ms)
        assert rep.get("req") == self.req, (rep, self.req)
        return cmd, rep, pl


class Subscriber:
    """SUB to the event endpoint, topic = job id."""

    def __init__(self, ctx, endpoint):
        self.sock = ctx.socket(zmq.SUB)
        self.sock.linger = 0
        self.sock.connect(endpoint)

    def subscribe(self, job):
        self.sock.setsockopt(zmq.SUBSCRIBE, job.encode())

    def wait_heartbeat(self, diag=lambda: ""):
        """Until a heartbeat arrives (subscribed to them or to everything):
        the subscription is in place, later events are not lost to a slow
        joiner."""
        while True:
            if not self.sock.poll(20000):
                raise AssertionError("no heartbeat\n" + diag())
            if self.sock.recv_multipart()[0] == b"@heartbeat":
                return

    def collect(self, job, timeout_s=60):
        """Every event of job until its FINISH: (tokens, finish). A TOKEN's
        ids are in "ids", its logprobs (when asked for) in "lp", "top_ids"
        and "top_lp"."""
        tokens, end = [], time.time() + timeout_s
        while time.time() < end:
            if not self.sock.poll(200):
                continue
            f = self.sock.recv_multipart()
            if f[0] != job.encode():
                continue  # prefix match of another job, or a heartbeat
            assert f[1] == b"EVT1", f[1]
            hdr = msgpack.unpackb(f[3])
            if f[2] == b"\x01":
                hdr["ids"] = ids_of(f[4])
                if len(f) > 5:
                    hdr.update(logprob_frames(len(hdr["ids"]), hdr.get("top_n", 0), f[5:8]))
                tokens.append(hdr)
            elif f[2] == b"\x02":
                return tokens, hdr
            else:
                raise AssertionError("unknown event command %r" % f[2])
        raise AssertionError("no FINISH for %s within %d s" % (job, timeout_s))


def worker_pid(daemon_pid, stage):
    """The pid of tokpiped's child serving stage (its --stage list)."""
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % p) as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open("/proc/%s/cmdline" % p, "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if ppid == daemon_pid and b"--stage" in args and args[args.index(b"--stage") + 1] == stage.encode():
            return int(p)
    return None


class Daemon:
    """tokpiped on a config of its own, in a new temporary directory that is
    also its runtime_dir (ipc endpoints <dir>/front.sock, <dir>/events.sock
    unless endpoints are given); its output goes to <dir>/tokpiped.log.

    config is YAML appended after runtime_dir, the model (model=None: none,
    config says) and, unless http=True, `http: enabled: false` (the default
    would open 127.0.0.1:8080 for every test daemon). ready=True: returns once
    every stage has a worker; sub_all=True: with self.sub, a Subscriber to
    every event, in force (subscriber("")); either failing stops it and
    raises. A `with` block stops it; stop waits stop_timeout_s for a clean
    exit before it kills."""

    def __init__(self, config="", model=STORIES, tokenizer=TOK512, chat_template=None, endpoints=None,
                 http=False, env=None, prefix="tp-test-", stop_timeout_s=15, start=True, ready=False,
                 sub_all=False):
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.config = os.path.join(self.dir, "tokpipe.yaml")
        self.logpath = os.path.join(self.dir, "tokpiped.log")
        self.front = "ipc://" + os.path.join(self.dir, "front.sock")
        self.events = "ipc://" + os.path.join(self.dir, "events.sock")
        if endpoints:
            self.front = endpoints.get("front", self.front)
            self.events = endpoints.get("events", self.events)
        self.ctx = self.proc = self.log = self._prod = self.sub = None
        self.stop_timeout_s = stop_timeout_s
        self.env = env
        self.head = "runtime_dir: %s\n" % json.dumps(self.dir)
        if model is not None:
            self.head += "model:\n  path: %s\n  tokenizer: %s\n" % (json.dumps(model), json.dumps(tokenizer))
            if chat_template is not None:
                self.head += "  chat_template: %s\n" % json.dumps(chat_template)
        if endpoints:
            self.head += "endpoints:\n" + "".join("  %s: %s\n" % kv for kv in endpoints.items())
        if not http:
            self.head += "http:\n  enabled: false\n"
        if start:
            self.start(config)
        if start and (ready or sub_all):
            try:
                if ready:
                    self.wait_ready()
                if sub_all:
                    self.sub = self.subscriber("")
            except BaseException:
                self.stop()
                raise

    def start(self, config=""):
        """Write the config and start tokpiped (start=False waited for this:
        files the config names can be made in dir first)."""
        with open(self.config, "w") as f:
            f.write(self.head + config)
        self.log = open(self.logpath, "wb")
        try:
            self.proc = subprocess.Popen([TOKPIPED, "--config", self.config], stdout=self.log, stderr=self.log,
                                         env=self.env)
        except BaseException:
            self.stop()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def log_text(self, tail=3000):
        self.log.flush()
        with open(self.logpath, "rb") as f:
            return f.read().decode(errors="replace")[-tail:]

    def zmq(self):
        """This daemon's zmq context (closed, sockets and all, by stop)."""
        if self.ctx is None:
            self.ctx = zmq.Context()
        return self.ctx

    def call(self, cmd, hdr, *payload, timeout_ms=10000):
        """A request on this daemon's own producer: (command, header, payload)."""
        if self._prod is None:
            self._prod = Producer(self.zmq(), self.front, self.log_text)
        return self._prod.call(cmd, hdr, *payload, timeout_ms=timeout_ms)

    def subscriber(self, *topics):
        """A Subscriber on this daemon's context to topics (job ids; "" is
        every event) and heartbeats, returned once the subscription is in
        force (a heartbeat came through it)."""
        sub = Subscriber(self.zmq(), self.events)
        for t in topics:
            sub.subscribe(t)
        if "" not in topics:
            sub.subscribe("@heartbeat")   # last: the broker answers it at once
        sub.wait_heartbeat(self.log_text)
        return sub

    def wait_ready(self, timeout_s=60, dealer=None):
        """Until every stage has a live worker: STATS on a new DEALER each try
        (dealer() makes one; default plain to front), so a late reply to a try
        that timed out is never read as the next one's. Returns that STATS."""
        end = time.time() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise AssertionError("tokpiped exited (%d)\n%s" % (self.proc.returncode, self.log_text()))
            if dealer:
                sock = dealer()
            else:
                sock = self.zmq().socket(zmq.DEALER)
                sock.linger = 0
                sock.sndtimeo = 5000
                sock.connect(self.front)
            try:
                st = stats(sock, 500)
            finally:
                sock.close(0)
            if st and all(st.get("workers", {}).get(s, 0) > 0 for s in STAGES):
                return st
            if time.time() > end:
                raise AssertionError("workers never registered within %d s\n%s" % (timeout_s, self.log_text()))
            time.sleep(0.1)

    def wait_worker(self, stage, but=None, timeout_s=60):
        """Until a spawned worker of stage (its --stage list; another pid
        than `but`) runs and STATS counts one of the stage: its pid. For a
        stage wait_ready does not wait for (draft)."""
        end = time.time() + timeout_s
        while time.time() < end:
            pid = worker_pid(self.proc.pid, stage)
            if pid and pid != but and self.wait_ready()["workers"].get(stage, 0) > 0:
                return pid
            time.sleep(0.1)
        raise AssertionError("no %s worker registered\n%s" % (stage, self.log_text()))

    def stop(self):
        """SIGTERM (SIGKILL after stop_timeout_s), then the directory goes."""
        if self.ctx is not None:
            self.ctx.destroy(linger=0)
            self.ctx = self._prod = self.sub = None
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.log is not None:
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def wait_health(port, timeout_s=60, healthy=True, gone=lambda: False):
    """Until the gateway on port answers GET /health 200 (healthy=False: or
    503 naming the missing stages): True, or False once timeout_s passed or
    gone() says its process has exited."""
    deadline = time.time() + timeout_s
    while True:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            c.request("GET", "/health")
            r = c.getresponse()
            st, body = r.status, r.read()
            c.close()
            if st == 200 or (not healthy and st == 503 and b"missing" in body):
                return True
        except OSError:
            pass
        if time.time() > deadline or gone():
            return False
        time.sleep(0.1)


class HttpDaemon(Daemon):
    """A Daemon that also starts its HTTP gateway (tokpipe-http) on a free
    loopback port (self.port; the config has `http:\n  port: N\n`), ready
    once /health answers 200, or with healthy=False 503 naming the missing
    stages."""

    def __init__(self, config="", healthy=True, prefix="tp-http-", stop_timeout_s=90, **kw):
        self.port = free_port()
        super().__init__("http:\n  port: %d\n" % self.port + config, http=True, prefix=prefix,
                         stop_timeout_s=stop_timeout_s, **kw)
        if not wait_health(self.port, healthy=healthy, gone=lambda: self.proc.poll() is not None):
            self.stop()
            raise AssertionError("gateway not healthy; log: " + self.log_text())


class DaemonCase(unittest.TestCase):
    """A test class with one ready daemon (config CONFIG) for all its tests:
    cls.daemon, and on its zmq context cls.ctx a producer cls.prod and a
    subscriber cls.sub. Subclass it as tpdaemon.DaemonCase: a name imported
    into a test module would be collected as a test class of its own."""
    CONFIG = ""
    PREFIX = "tp-test-"

    @classmethod
    def setUpClass(cls):
        if not os.access(TOKPIPED, os.X_OK):
            raise unittest.SkipTest("%s not built (run make)" % TOKPIPED)
        cls.daemon = Daemon(cls.CONFIG, prefix=cls.PREFIX)
        cls.addClassCleanup(cls.daemon.stop)
        cls.ctx = cls.daemon.zmq()
        cls.prod = Producer(cls.ctx, cls.daemon.front, cls.daemon.log_text)
        cls.sub = Subscriber(cls.ctx, cls.daemon.events)
        cls.daemon.wait_ready()


class HttpDaemonCase(unittest.TestCase):
    """A test class with one healthy HttpDaemon for all its tests: cls.d and
    its gateway's port cls.port, stopped by a class cleanup (so cleanups a
    subclass's setUpClass registers before calling this one, such as the
    removal of a model it made, run after the stop). new_daemon() makes it;
    override it for another config, model or HttpDaemon subclass. Skipped
    when tokpipe-http is not built. Subclass it as tpdaemon.HttpDaemonCase
    (see DaemonCase)."""

    @classmethod
    def new_daemon(cls):
        return HttpDaemon()

    @classmethod
    def setUpClass(cls):
        if not os.access(TOKPIPE_HTTP, os.X_OK):
            raise unittest.SkipTest("%s not built (run make)" % TOKPIPE_HTTP)
        cls.d = cls.new_daemon()
        cls.addClassCleanup(cls.d.stop)
        cls.port = cls.d.port
