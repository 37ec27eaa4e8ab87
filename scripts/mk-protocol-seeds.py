#!/usr/bin/python3
# Writes the seed corpus of fuzz/fuzz_protocol.c: one valid message of most
# commands (plus a huge-count header) in the fuzzer input layout.
# usage: scripts/mk-protocol-seeds.py fuzz/corpus/fuzz_protocol
import msgpack, struct, os, sys
out = sys.argv[1]
def frames(fam, fr):
    b = bytes([fam])
    for x in fr:
        b += struct.pack('<H', len(x)) + x
    return b
def i32(*v): return struct.pack('<%di' % len(v), *v)
def u32(*v): return struct.pack('<%dI' % len(v), *v)
def f32(*v): return struct.pack('<%df' % len(v), *v)
P = msgpack.packb
seeds = {
 'submit_text': frames(0, [b'JOB1', b'\x01', P({'req': 1, 'job_id': 'j1', 'prompt': 'Once upon', 'params': {
    'max_tokens': 16, 'min_tokens': 1, 'temperature': 0.5, 'top_p': 0.9, 'top_k': 40, 'min_p': 0.1,
    'repetition_penalty': 1.1, 'presence_penalty': 0.5, 'frequency_penalty': -0.5, 'seed': 7,
    'stop': ['\n', 'The end'], 'stop_token_ids': [2, 13], 'ignore_eos': True, 'include_stop_str_in_output': False}})]),
 'submit_ids': frames(0, [b'JOB1', b'\x01', P({'job_id': 'j2'}), i32(1, 400, 33)]),
 'submit_messages': frames(0, [b'JOB1', b'\x01', P({'job_id': 'j3', 'messages': [
    {'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'Hi <|end|>'}],
    'params': {'max_tokens': 4}})]),
 'tokenize_messages': frames(1, [b'WRK1', b'\x10', P({'task': 5, 'slot': 1, 'text': '', 'add_bos': True,
    'messages': [{'role': 'user', 'content': ''}]})]),
 'tokenized_stop_ids': frames(1, [b'WRK1', b'\x11', P({'task': 5, 'status': 200, 'slot': 1, 'stop_ids': [32007]}),
    i32(1, 32010, 13)]),
 'ack': frames(0, [b'JOB1', b'\x02', P({'req': 1, 'status': 400, 'job_id': 'j', 'error': 'params.top_p: bad', 'field': 'params.top_p'})]),
 'cancel': frames(0, [b'JOB1', b'\x03', P({'job_id': 'j1'})]),
 'status_reply': frames(0, [b'JOB1', b'\x05', P({'req': 2, 'status': 200, 'job_id': 'j', 'state': 'finished',
    'prompt_tokens': 3, 'completion_tokens': 2, 'last_seq': 2, 'reason': 'stop_string', 'matched': '\n',
    'text': 'ab', 'queue_us': 1, 'ttft_us': 2, 'total_us': 3}), i32(5, 6)]),
 'stats_reply': frames(0, [b'JOB1', b'\x07', P({'status': 200, 'jobs_submitted': 3,
    'workers': {'tokenize': 1, 'forward': 1, 'sample': 1, 'stop': 1}, 'finish': {'eos': 2, 'length': 1},
    'stop_triggers': [['\n', 3, False], [2, 1, False]], 'triggers_other': 0})]),
 'error': frames(0, [b'JOB1', b'\x7f', P({'req': 0, 'status': 501, 'error': 'F1: unknown'})]),
 'token': frames(2, [b'j1', b'EVT1', b'\x01', P({'job_id': 'j1', 'seq': 0, 'index': 0, 'text': ' the'}), i32(278)]),
 'finish': frames(2, [b'j1', b'EVT1', b'\x02', P({'job_id': 'j1', 'seq': 1, 'reason': 'eos', 'matched': 2, 'text': '',
    'prompt_tokens': 3, 'completion_tokens': 1, 'text_len': 4, 'queue_us': 1, 'ttft_us': 2, 'total_us': 3})]),
 'evt_heartbeat': frames(2, [b'@heartbeat', b'EVT1', b'\x03', P({'incarnation': 2**63 + 5, 'uptime_ms': 1500,
    'interval_ms': 1000, 'liveness': 3})]),
 'status_reply_running': frames(0, [b'JOB1', b'\x05', P({'req': 3, 'status': 200, 'job_id': 'j', 'state': 'running',
    'prompt_tokens': 3, 'completion_tokens': 2, 'last_seq': 1, 'text': ' a', 'text_len': 2}), i32(5, 6)]),
 'ready': frames(1, [b'WRK1', b'\x01', P({'stages': ['forward', 'sample'], 'instance': 'forward.0', 'incarnation': 99,
    'capacity': 64, 'heartbeat_ms': 1000, 'model_id': 'm', 'vocab_size': 512, 'bos_id': 1, 'eos_id': 2,
    'seq_len': 512, 'max_batch_tokens': 256})]),
 'ready_special': frames(1, [b'WRK1', b'\x01', P({'stages': ['tokenize'], 'instance': 'tokenize.0', 'incarnation': 7,
    'capacity': 8, 'heartbeat_ms': 1000, 'model_id': 'm', 'vocab_size': 512, 'bos_id': 1, 'eos_id': 2,
    'seq_len': 0, 'max_batch_tokens': 0, 'eog_ids': [2]}), i32(0, 1, 2), b'\x05<unk>\x03<s>\x04</s>']),
 'info_reply': frames(0, [b'JOB1', b'\x09', P({'req': 4, 'status': 200, 'model_id': 'm', 'vocab_size': 512,
    'context_length': 512, 'bos_id': 1, 'eos_id': 2, 'eog_ids': [1, 2], 'chat_template': False, 'weight_type': 'f32',
    'limits': {'max_tokens': 4096, 'max_logit_bias': 1024, 'max_top_logprobs': 20}}), i32(0, 1, 2),
    b'\x05<unk>\x03<s>\x04</s>']),
 'step': frames(1, [b'WRK1', b'\x22', P({'task': 1, 'step': 1, 'n': 2, 'n_tokens': 3, 'sample': False}),
    u32(1, 2), u32(0, 5), u32(2, 1), b'\x01\x01', i32(1, 5, 9), i32(-1, 9)]),
 'step_result': frames(1, [b'WRK1', b'\x23', P({'task': 1, 'step': 1, 'status': 200, 'n': 1, 'vocab': 2, 'sampled': False}),
    u32(1), f32(0.5, -1)]),
 'sample': frames(1, [b'WRK1', b'\x32', P({'task': 2, 'step': 1, 'n': 1, 'vocab': 3}), u32(1), u32(0), i32(-1), f32(1, 2, 3)]),
 'sample_open': frames(1, [b'WRK1', b'\x30', P({'task': 2, 'slot': 1, 'params': {'temperature': 0, 'seed': 3}, 'ban_ids': [2]}), i32(1, 2)]),
 'stop_open': frames(1, [b'WRK1', b'\x40', P({'task': 3, 'slot': 1, 'job_id': 'j1', 'params': {'stop': ['x'], 'max_tokens': 4},
    'prompt_tokens': 3, 'prev_token': 1, 'next_seq': 0, 't_submit_us': 1, 't_start_us': 2}), b'']),
 'verdicts': frames(1, [b'WRK1', b'\x43', P({'task': 3, 'step': 1, 'status': 200, 'n': 2}), u32(1, 2), b'\x01\x00', b'\x00\x03']),
 'huge_count': frames(0, [b'JOB1', b'\x06', b'\xdd\x00\x98\x96\x80']),
 'status': frames(0, [b'JOB1', b'\x04', P({'req': 3, 'job_id': 'j1'})]),
 'stats': frames(0, [b'JOB1', b'\x06', P({'req': 4})]),
 'welcome': frames(1, [b'WRK1', b'\x02', P({'incarnation': 5, 'heartbeat_ms': 1000, 'liveness': 3, 'worker_no': 1})]),
 'heartbeat': frames(1, [b'WRK1', b'\x03', P({'progress': 9, 'inflight': 1})]),
 'disconnect': frames(1, [b'WRK1', b'\x04', P({'reason': 'bye'})]),
 'result': frames(1, [b'WRK1', b'\x05', P({'task': 1, 'status': 404, 'error': 'slot 3: not open'})]),
 'tokenize': frames(1, [b'WRK1', b'\x10', P({'task': 1, 'slot': 2, 'text': 'Hello', 'add_bos': True})]),
 'tokenized': frames(1, [b'WRK1', b'\x11', P({'task': 1, 'status': 200, 'slot': 2}), i32(1, 400)]),
 'seq_open': frames(1, [b'WRK1', b'\x20', P({'task': 1, 'slot': 2})]),
 'step_result_sampled': frames(1, [b'WRK1', b'\x23', P({'task': 1, 'step': 1, 'status': 200, 'n': 1, 'vocab': 0, 'sampled': True}), u32(1), i32(5)]),
 'sampled': frames(1, [b'WRK1', b'\x33', P({'task': 2, 'step': 1, 'status': 200, 'n': 1}), u32(1), i32(7)]),
 'stop_close': frames(1, [b'WRK1', b'\x41', P({'task': 3, 'slot': 1, 'finish': 'cancelled'})]),
 'stop_step': frames(1, [b'WRK1', b'\x42', P({'task': 3, 'step': 1, 'n': 1}), u32(1), i32(13)]),
 'draft': frames(1, [b'WRK1', b'\x50', P({'task': 4, 'n': 2, 'n_tokens': 4}), u32(1, 2), u32(0, 9), u32(3, 1),
                     u32(4, 2), i32(1, 50, 60, 70)]),
 'drafted': frames(1, [b'WRK1', b'\x51', P({'task': 4, 'status': 200, 'n': 2}), u32(1, 2), u32(4, 0), i32(5, 6, 7, 8)]),
 'draft_close': frames(1, [b'WRK1', b'\x52', P({'task': 5, 'slot': 1})]),
}
os.makedirs(out, exist_ok=True)
for k, v in seeds.items():
    open(os.path.join(out, k), 'wb').write(v)
