#!/usr/bin/env python3
"""Regenerates a greedy-parity fixture (daemon/tests/fixtures/greedy_*.json) from llama.cpp.

Start the reference first (built by ../shared/tools/build-llama-cpp.sh), on the model the
fixture is for:
    llama-server -m ~/.local/share/sparkd/models/smollm2-135m-instruct.gguf --port 8089 --host 127.0.0.1 \
        -fa off -ctk f32 -ctv f32
Full-precision attention and KV cache (sparkd keeps K/V in f32): with its defaults
(flash attention, f16 K/V) llama.cpp itself drifts by ~0.05 nats, enough to flip near-ties.
Then run this script from the repository root:
    scripts/make-greedy-fixtures.py                      # greedy_smollm2.json, the default model
    MODEL=target/tmp/smollm2-135m-ffn-q2k-q3k.gguf NAME=smollm2-135m-ffn-q2k-q3k \
        OUT=daemon/tests/fixtures/greedy_smollm2_q2k_q3k.json scripts/make-greedy-fixtures.py
    MODEL=target/tmp/smollm2-135m-iq4.gguf NAME=smollm2-135m-iq4 \
        OUT=daemon/tests/fixtures/greedy_smollm2_iq4.json scripts/make-greedy-fixtures.py
    MODEL=target/tmp/smollm2-135m-mistral3-yarn.gguf NAME=smollm2-135m-mistral3-yarn \
        OUT=daemon/tests/fixtures/greedy_smollm2_mistral3.json scripts/make-greedy-fixtures.py
(the second model is the default one with its ffn_down matrices requantized to Q2_K and
Q3_K, the third llama-quantize's IQ4_XS mix of it: IQ4_XS where rows are whole
256-blocks, IQ4_NL for the other layer matrices; `cargo test -p sparkd --test
greedy_parity` writes them there), and the fourth the default model's weights
relabelled as `mistral3` with YaRN and the attention temperature (see the test).
"""
import hashlib
import os
import json
import urllib.request

BASE = "http://127.0.0.1:" + (__import__("os").environ.get("PORT") or "8089")


def post(path, body):
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req).read())


CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "Write a haiku about the sea."}],
    [{"role": "user", "content": "Explain what a Unix socket is in two sentences."}],
]
RAWS = ["The quick brown fox", "def fibonacci(n):\n    ", "Once upon a time, in a small village,"]

# End-of-generation tokens of SmolLM2 (<|endoftext|>, <|im_end|>), masked by ignore_eos.
MASKED = [0, 2]

prompts = [("chat", post("/apply-template", {"messages": c})["prompt"]) for c in CHATS]
prompts += [("raw", r) for r in RAWS]
cases = []
for kind, p in prompts:
    toks = post("/tokenize", {"content": p, "add_special": True, "parse_special": True})["tokens"]
    out = post("/completion", {"prompt": toks, "n_predict": 32, "temperature": 0, "top_k": 1,
                               "cache_prompt": False, "return_tokens": True, "ignore_eos": True,
                               "samplers": ["top_k"], "n_probs": 4})
    # Per step, llama.cpp's own logprobs of its top two tokens: where they are a near
    # tie, float summation order alone can flip the choice in any implementation.
    # ignore_eos masks the end-of-generation tokens, which the reported logprobs still list.
    top2 = [[[t["id"], round(t["logprob"], 4)] for t in step["top_logprobs"] if t["id"] not in MASKED][:2]
            for step in out["completion_probabilities"]]
    cases.append({"kind": kind, "prompt_ids": toks, "expected_ids": out["tokens"], "top2": top2})
MODEL = os.path.expanduser(os.environ.get("MODEL", "~/.local/share/sparkd/models/smollm2-135m-instruct.gguf"))
with open(MODEL, "rb") as f:
    sha256 = hashlib.file_digest(f, "sha256").hexdigest()
json.dump({"model": os.environ.get("NAME", "smollm2-135m-instruct"),
           "sha256": sha256,
           "source": "llama.cpp llama-server (llama-cpp-python 0.3.36 vendor), /completion (-fa off -ctk f32 -ctv f32) temperature 0, "
                     "top_k 1, ignore_eos, 32 tokens",
           "masked_ids": MASKED,
           "cases": cases},
          open(os.environ.get("OUT", "daemon/tests/fixtures/greedy_smollm2.json"), "w"), indent=1)
