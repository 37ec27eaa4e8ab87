"""A CURVE producer and subscriber written from protocol/PROTOCOL.md section 7
alone (pyzmq + msgpack), against the real tokpiped on tcp loopback with
security.curve on: a key listed in authorized_keys streams a greedy job whose
text equals `tokpipe run`; a listed key aimed at the wrong broker key and a
plain-text socket get no reply.
"""
import json
import os
import subprocess
import sys
import time
import unittest

import msgpack
import zmq

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import tpdaemon  # noqa: E402
from tpdaemon import MODELS, TOKPIPE, TOKPIPED, stats  # noqa: E402


def key_of(path):
    """The first key of a key file: '#' lines skipped, a label may follow."""
    with open(path) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                return line.split()[0].encode()
    raise AssertionError("no key in " + path)


class CurveClient(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.path.exists(TOKPIPED) or not zmq.has("curve"):
            raise unittest.SkipTest("tokpiped not built or pyzmq without CURVE")
        cls.ep = {n: "tcp://127.0.0.1:%d" % tpdaemon.free_port() for n in ("front", "back", "events", "publish")}
        # the keys live in the daemon's directory, made before the daemon starts
        cls.daemon = tpdaemon.Daemon(endpoints=cls.ep, prefix="tp-curve-", start=False)
        cls.addClassCleanup(cls.daemon.stop)
        d = cls.daemon.dir
        for name in ("broker", "worker"):
            subprocess.run([TOKPIPE, "keygen", "--out", os.path.join(d, name)], check=True, capture_output=True)
        cls.pub, cls.sec = zmq.curve_keypair()  # a third-party client's own pair
        with open(os.path.join(d, "authorized_keys"), "w") as f:
            f.write(open(os.path.join(d, "worker.pub")).read())
            f.write(cls.pub.decode() + " python client\n")
        config = "security:\n  curve: true\n"
        for k, v in (("server_secret_key", "broker.key"), ("server_public_key", "broker.pub"),
                     ("authorized_keys", "authorized_keys"), ("client_secret_key", "worker.key")):
            config += "  %s: %s\n" % (k, json.dumps(os.path.join(d, v)))
        cls.daemon.start(config)
        cls.ctx = zmq.Context()
        cls.server_key = key_of(os.path.join(d, "broker.pub"))
        cls.daemon.wait_ready(30, lambda: cls.socket(zmq.DEALER, cls.ep["front"]))

    @classmethod
    def tearDownClass(cls):
        cls.ctx.destroy(linger=0)

    @classmethod
    def socket(cls, kind, endpoint, server_key=None, curve=True):
        s = cls.ctx.socket(kind)
        s.linger = 0
        # a DEALER whose handshake never completes blocks in send: fail, not hang
        s.sndtimeo = 5000
        if curve:
            s.curve_serverkey = server_key or cls.server_key
            s.curve_publickey, s.curve_secretkey = cls.pub, cls.sec
        s.connect(endpoint)
        return s

    def test_listed_key_streams_the_same_text_as_tokpipe_run(self):
        sub = self.socket(zmq.SUB, self.ep["events"])
        sub.setsockopt(zmq.SUBSCRIBE, b"py-curve")
        prod = self.socket(zmq.DEALER, self.ep["front"])
        time.sleep(0.3)  # the subscription reaches the broker's XPUB
        prod.send_multipart([b"JOB1", b"\x01", msgpack.packb(
            {"job_id": "py-curve", "prompt": "Once upon a time", "params": {"max_tokens": 40, "temperature": 0}})])
        self.assertTrue(prod.poll(5000), "no ACK over CURVE")
        ack = msgpack.unpackb(prod.recv_multipart()[2])
        self.assertEqual(ack["status"], 200, ack)
        text, end = "", time.time() + 30
        while time.time() < end:
            self.assertTrue(sub.poll(5000), "events stopped before FINISH")
            f = sub.recv_multipart()
            text += msgpack.unpackb(f[3])["text"]
            if f[2] == b"\x02":
                break
        prod.close()
        sub.close()
        run = subprocess.run([TOKPIPE, "run", "--model", os.path.join(MODELS, "stories260K.bin"), "--tokenizer",
                              os.path.join(MODELS, "tok512.bin"), "--json", "--prompt", "Once upon a time",
                              "--temperature", "0", "--max-tokens", "40"], check=True, capture_output=True, text=True)
        self.assertEqual(text, json.loads(run.stdout)["text"])

    def test_wrong_broker_key_and_plain_text_get_no_reply(self):
        other, _ = zmq.curve_keypair()
        for name, s in (("wrong broker key", self.socket(zmq.DEALER, self.ep["front"], server_key=other)),
                        ("plain text", self.socket(zmq.DEALER, self.ep["front"], curve=False))):
            self.assertIsNone(stats(s, 1000), name + " got a reply")
            s.close()
        ok = self.socket(zmq.DEALER, self.ep["front"])
        st = stats(ok, 5000)
        ok.close()
        self.assertIsNotNone(st, "the listed key lost its service")
        self.assertEqual(st.get("zap_refused", 0), 0, "handshakes that never reach ZAP are not counted")


if __name__ == "__main__":
    unittest.main()
