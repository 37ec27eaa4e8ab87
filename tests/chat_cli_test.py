"""tokpipe chat (issue 39): a conversation, in process (--model) and through
tokpiped, piped and in a real terminal (tmux).

stories260K has no chat template: the tests give Qwen2.5's with --template
(in process) or the daemon's model.chat_template. The oracle for what the
model is sent is python3-jinja2 rendering the conversation that /save wrote
(the way chat_template_test.py renders templates)."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
import tpdaemon  # noqa: E402
from tpdaemon import MODELS, TOKPIPE  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chat_template_test import oracle_env  # noqa: E402

STORIES = os.path.join(MODELS, "stories260K.gguf")
TEMPLATE = os.path.join(MODELS, "chat-templates", "Qwen-Qwen2.5-7B-Instruct.jinja")
GREEDY = ["--temperature", "0", "--max-tokens", "12"]


def chat(*args, stdin=b"", timeout=120):
    p = subprocess.run([TOKPIPE, "chat", *args], input=stdin, capture_output=True, timeout=timeout)
    return p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")


def prompts_of(stderr):
    """The prompts --show-prompt wrote, in order."""
    out, cur = [], None
    for line in stderr.split("\n"):
        if line == "--- prompt ---":
            cur = []
        elif line == "--- end ---" and cur is not None:
            out.append("\n".join(cur))
            cur = None
        elif cur is not None:
            cur.append(line)
    return out


def status_lines(stderr):
    """(prompt, cached, generated) of each status line."""
    out = []
    for line in stderr.split("\n"):
        if "prompt tokens," in line:
            w = line.replace("[", " ").replace(",", " ").split()
            out.append((int(w[w.index("prompt") - 1]), int(w[w.index("cached") - 1]),
                        int(w[w.index("generated") - 1])))
    return out


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def render(messages, **kw):
    with open(TEMPLATE, encoding="utf-8") as f:
        source = f.read()
    return oracle_env().from_string(source).render(messages=messages, add_generation_prompt=True,
                                                   bos_token="<s>", eos_token="</s>", **kw)


class ChatInProcess(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tp-chat-cli-")
        self.addCleanup(shutil.rmtree, self.dir, True)

    def test_help_names_the_commands(self):
        rc, out, _ = chat("--help")
        self.assertEqual(rc, 0)
        for what in ("--model", "--template", "--hide-thinking", "/reset", "/save", "/load", "--temperature"):
            self.assertIn(what, out)

    def test_piped_two_turns_send_the_jinja2_rendering_of_the_history(self):
        saved = os.path.join(self.dir, "c.json")
        rc, out, err = chat("--model", STORIES, "--template", TEMPLATE, "--show-prompt", "--verbose", *GREEDY,
                            stdin=("Hi\nTell me more\n/save %s\n" % saved).encode())
        self.assertEqual(rc, 0, err)
        history = load(saved)
        self.assertEqual([m["role"] for m in history], ["user", "assistant", "user", "assistant"])
        self.assertEqual(history[0]["content"], "Hi")
        self.assertEqual(history[2]["content"], "Tell me more")
        sent = prompts_of(err)
        self.assertEqual(len(sent), 2, err)
        self.assertEqual(sent[0], render(history[:1]))
        self.assertEqual(sent[1], render(history[:3]), "the second turn's prompt is not the history's rendering")
        # the replies are what stdout shows, each ending a line
        self.assertEqual(out, history[1]["content"] + "\n" + history[3]["content"] + "\n")
        st = status_lines(err)
        self.assertEqual(len(st), 2, err)
        self.assertGreater(st[1][0], st[0][0])
        self.assertGreater(st[1][1], 0, "in process too, turn 2 takes the pages of turn 1: " + err)

    def test_a_model_without_a_template_is_named_with_the_way_out(self):
        rc, out, err = chat("--model", STORIES, stdin=b"Hi\n")
        self.assertEqual(rc, 1)
        self.assertEqual(out, "")
        self.assertIn(STORIES + " has no chat template", err)
        self.assertIn("--template FILE", err)

    def test_system_reset_save_and_load(self):
        a, b, c = (os.path.join(self.dir, n) for n in ("a.json", "b.json", "c.json"))
        script = "/system Be brief.\nHi\n/save {a}\n/reset\n/save {b}\n/load {a}\nAgain\n/save {c}\n".format(a=a, b=b, c=c)
        rc, out, err = chat("--model", STORIES, "--template", TEMPLATE, "--show-prompt", *GREEDY,
                            stdin=script.encode())
        self.assertEqual(rc, 0, err)
        ha, hb, hc = (load(p) for p in (a, b, c))
        self.assertEqual([m["role"] for m in ha], ["system", "user", "assistant"])
        self.assertEqual(ha[0]["content"], "Be brief.")
        self.assertEqual(hb, ha[:1], "/reset keeps only the system message")
        self.assertEqual(hc[:3], ha, "/load brings the saved turns back")
        self.assertEqual(hc[3], {"role": "user", "content": "Again"})
        self.assertEqual(prompts_of(err)[1], render(hc[:4]))
        # what /save writes, --messages reads
        rc, out, err = chat("--model", STORIES, "--template", TEMPLATE, "--messages", a, "--show-prompt", *GREEDY,
                            stdin=b"Again\n")
        self.assertEqual(rc, 0, err)
        self.assertEqual(prompts_of(err)[0], render(hc[:4]))

    def test_tools_are_offered_in_the_prompt(self):
        from chat_template_test import WEATHER_TOOL
        tools = os.path.join(self.dir, "tools.json")
        with open(tools, "w") as f:
            json.dump([WEATHER_TOOL], f)
        rc, out, err = chat("--model", STORIES, "--template", TEMPLATE, "--tools", tools, "--show-prompt", *GREEDY,
                            stdin=b"Weather in Paris?\n")
        self.assertEqual(rc, 0, err)
        self.assertEqual(prompts_of(err)[0], render([{"role": "user", "content": "Weather in Paris?"}],
                                                    tools=[WEATHER_TOOL]))

    def test_multi_line_input_and_help(self):
        saved = os.path.join(self.dir, "m.json")
        rc, out, err = chat("--model", STORIES, "--template", TEMPLATE, *GREEDY,
                            stdin=("/help\none \\\ntwo\n/save %s\n" % saved).encode())
        self.assertEqual(rc, 0, err)
        self.assertIn("/reset", out)
        self.assertEqual(load(saved)[0]["content"], "one \ntwo")

    def test_a_bad_load_is_said_and_the_conversation_goes_on(self):
        bad = os.path.join(self.dir, "bad.json")
        with open(bad, "w") as f:
            f.write('{"messages": 3}')
        rc, out, err = chat("--model", STORIES, "--template", TEMPLATE, *GREEDY,
                            stdin=("/load %s\nHi\n" % bad).encode())
        self.assertEqual(rc, 0, err)
        self.assertIn("/load", err)
        self.assertIn("prompt tokens", chat("--model", STORIES, "--template", TEMPLATE, "--verbose", *GREEDY,
                                            stdin=b"Hi\n")[2])


class ChatThroughTheDaemon(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = tpdaemon.Daemon(model=STORIES, tokenizer="", chat_template=TEMPLATE, prefix="tp-chat-cli-",
                                stop_timeout_s=60, ready=True)
        cls.addClassCleanup(cls.d.stop)

    def test_the_second_turn_is_served_from_the_prefix_cache(self):
        dir_ = tempfile.mkdtemp(prefix="tp-chat-cli-")
        self.addCleanup(shutil.rmtree, dir_, True)
        saved = os.path.join(dir_, "d.json")
        rc, out, err = chat("--config", self.d.config, "--verbose", *GREEDY,
                            stdin=("Hi\nTell me more\n/save %s\n" % saved).encode())
        self.assertEqual(rc, 0, err)
        st = status_lines(err)
        self.assertEqual(len(st), 2, err)
        self.assertGreater(st[1][1], 0, "turn 2 took nothing from the prefix cache: " + err)
        # the daemon was sent the same conversation as the in-process run,
        # whose prompt is jinja2's rendering (greedy: the same replies)
        saved2 = os.path.join(dir_, "p.json")
        rc, out2, err2 = chat("--model", STORIES, "--template", TEMPLATE, "--show-prompt", "--verbose", *GREEDY,
                              stdin=("Hi\nTell me more\n/save %s\n" % saved2).encode())
        self.assertEqual(rc, 0, err2)
        self.assertEqual(load(saved), load(saved2))
        self.assertEqual(out, out2)
        self.assertEqual(prompts_of(err2)[1], render(load(saved)[:3]))
        self.assertEqual([s[0] for s in st], [s[0] for s in status_lines(err2)])
        self.assertGreaterEqual(st[1][1], st[0][0] // 2, "little of the first turn's prompt was cached: " + err)


def stats(config):
    p = subprocess.run([TOKPIPE, "stats", "--config", config, "--json"], capture_output=True, timeout=60)
    return json.loads(p.stdout)


@unittest.skipUnless(shutil.which("tmux"), "tmux is not installed (scripts/install-deps.sh)")
class ChatInATerminal(unittest.TestCase):
    """A real terminal: tmux runs tokpipe chat, send-keys types, capture-pane
    reads the screen. A slower random model (512 wide, 8 layers: tens of
    tokens a second here) leaves time to press Ctrl-C mid-reply."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="tp-chat-tty-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        cls.model = os.path.join(cls.dir, "slow.bin")
        cls.tok = os.path.join(cls.dir, "slowtok.bin")
        subprocess.run([TOKPIPE, "mkmodel", "--shape", "512x8", "--vocab", "512", "--seq-len", "2048", "--seed", "1",
                        "--out", cls.model, "--tokenizer-out", cls.tok], check=True, capture_output=True, timeout=300)
        cls.d = tpdaemon.Daemon(model=cls.model, tokenizer=cls.tok, chat_template=TEMPLATE, prefix="tp-chat-tty-",
                                stop_timeout_s=60, ready=True)
        cls.addClassCleanup(cls.d.stop)
        cls.sock = os.path.join(cls.dir, "tmux.sock")

    def tmux(self, *args):
        return subprocess.run(["tmux", "-S", self.sock, *args], capture_output=True, timeout=30)

    def screen(self):
        return self.tmux("capture-pane", "-p", "-J", "-S", "-200").stdout.decode("utf-8", "replace")

    def wait_for(self, what, timeout_s=60, after=0):
        end = time.time() + timeout_s
        while time.time() < end:
            s = self.screen()
            if what(s[after:]) if callable(what) else what in s[after:]:
                return s
            time.sleep(0.1)
        self.fail("the screen never showed %r:\n%s" % (what, self.screen()))

    def start(self, *args):
        # the pane stays after the command ends, so its exit can be read
        cmd = " ".join([TOKPIPE, "chat", "--config", self.d.config, *args])
        r = self.tmux("new-session", "-d", "-x", "150", "-y", "50", cmd, ";", "set-option", "remain-on-exit", "on")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.addCleanup(self.tmux, "kill-server")
        self.wait_for("> ")

    def exited(self, timeout_s=30, fail=True):
        """How the command ended: (status, signal), or a failure (None with
        fail False) if it did not."""
        end = time.time() + timeout_s
        while time.time() < end:
            f = self.tmux("display-message", "-p", "#{pane_dead}:#{pane_dead_status}:#{pane_dead_signal}:#{pane_pid}")
            dead, status, sig, pid = (f.stdout.decode().strip().split(":") + ["", "", "", ""])[:4]
            if dead == "1" and (status or sig):
                return status, sig
            # tmux 3.3a may see the pane's terminal close and yet leave the
            # process unreaped for a long while (no status yet): a zombie's
            # exit status is in /proc all the same (stat field 52, as
            # waitpid reports it)
            if pid.isdigit():
                try:
                    with open("/proc/%s/stat" % pid) as st:
                        fields = st.read().rsplit(")", 1)[1].split()
                    if fields[0] == "Z":
                        code = int(fields[49])
                        return (str(code >> 8), "") if code & 0x7f == 0 else ("", str(code & 0x7f))
                except (OSError, IndexError, ValueError):
                    pass
            time.sleep(0.1)
        if not fail:
            return None
        self.fail("tokpipe chat did not end:\n" + self.screen())

    def test_ctrl_c_cancels_the_reply_and_the_next_turn_works(self):
        saved = os.path.join(self.dir, "t.json")
        before = stats(self.d.config)["finish"].get("cancelled", 0)
        self.start("--max-tokens", "300", "--ignore-eos", "--temperature", "0")
        self.tmux("send-keys", "Hi", "Enter")
        # some of the reply on the screen, then Ctrl-C
        self.wait_for(lambda s: len(s.split("> Hi", 1)[-1].strip()) > 3)
        self.tmux("send-keys", "C-c")
        self.wait_for("[cancelled]")
        # the chat says so when it asks; the broker counts the job's FINISH
        # when the cancel reaches it (a moment later on a loaded machine)
        end = time.time() + 15
        while stats(self.d.config)["finish"].get("cancelled", 0) == before and time.time() < end:
            time.sleep(0.1)
        self.assertEqual(stats(self.d.config)["finish"].get("cancelled", 0), before + 1, "STATS counted no cancel")
        # the next turn runs to its end
        self.tmux("send-keys", "Again", "Enter")
        s = self.wait_for("generated in", timeout_s=120)
        self.assertIn("300 generated", s)
        self.tmux("send-keys", "/save " + saved, "Enter")
        self.wait_for("saved 2 messages")
        history = load(saved)
        self.assertEqual([m["role"] for m in history], ["user", "assistant"], "the cancelled turn stayed in the history")
        self.assertEqual(history[0]["content"], "Again")
        # Ctrl-D at the prompt ends it
        self.tmux("send-keys", "C-d")
        self.assertEqual(self.exited(), ("0", ""))

    def test_ctrl_c_at_the_prompt_ends_and_reset_works(self):
        self.start("--max-tokens", "4")
        self.tmux("send-keys", "/reset", "Enter")
        # the fresh prompt, so the key reaches the line editor, not the
        # moment between two reads while it sets the terminal up
        self.wait_for(lambda s: re.search(r"\[conversation reset\][ \t]*\n>[ \t]*\n*$", s))
        self.tmux("send-keys", "C-c")
        ended = self.exited(timeout_s=10, fail=False)
        if ended is None:   # a loaded machine can lose the first keystroke in that set-up: a person presses again
            self.tmux("send-keys", "C-c")
            ended = self.exited()
        status, sig = ended
        self.assertTrue(sig == "2" or status == "130", (status, sig))


if __name__ == "__main__":
    unittest.main()
