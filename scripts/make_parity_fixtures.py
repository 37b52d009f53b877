#!/usr/bin/env python3
"""Parity fixtures: what Hugging Face transformers + peft compute for Concord's tiny models.

A developer tool (never a CI or runtime dependency). Run from the repository root:

    cargo build --release
    /work/main/.venv/bin/python scripts/make_parity_fixtures.py [--concord target/release/concord]
        [--only NAME[,NAME...]]

For every tiny model spec below (Qwen2, Qwen3 and Llama 3 families; `--only` runs just the
named ones and leaves every other fixture untouched) it builds the checkpoint with
`concord model init-tiny` (deterministic per seed, so the Rust tests rebuild the very same
weights instead of committing them), loads it in transformers (f32; the bf16 checkpoint is
upcast to f32), checks that transformers read it as the family's own class with every
tensor used (no silent fallback to Qwen2; the class is recorded as `architecture`) and
writes under tests/fixtures/parity/:

  MODEL.json                  spec, architecture, per-case prompt/completion ids, log-probs
                              without and with a peft adapter (nonzero B), greedy
                              continuations, loss; Qwen3 prompts with enable_thinking=False
                              (Concord's default for training prompts), Llama prompts with
                              the template's fallback date (`chat_template_kwargs`) and
                              exactly one <|begin_of_text|>
  MODEL_adapter/              the peft adapter (adapter_model.safetensors + config)
  MODEL_grads.safetensors     d loss / d lora_{A,B} (f32 models only)
  chat.json                   chat-template texts and token ids, tiny ChatML template and
                              the real Qwen3 template (qwen3_tokenizer_config.json);
                              written only when the first model is among those run
  FAMILY_chat.json            qwen3_chat.json, llama_chat.json: the conversations through
                              the checkpoint's own tokenizer and chat template (text/ids;
                              Qwen3 also text_thinking/ids_thinking, enable_thinking=True;
                              Llama also plain encodings), from the family's first model run

It then cross-checks Concord itself: `concord score` against transformers on the same
inputs, and an adapter saved by Concord (`concord model init-adapter`) loaded in peft
gives equal log-probs (concord_checks.json; with `--only`, just those models' entries are
updated). Those checks print their max deltas and fail loudly; skip them with
--skip-concord-checks (e.g. before the model forward is built).

`--sft-only` runs just the SFT check (the fixture JSONs must exist): `concord sft` trains
an adapter on the cases of `--sft-model NAME` (default the first model; jsonl source, a few
steps), peft loads it, and its log-probs must equal `concord score --adapter`'s. It writes
NAME_sft_adapter/ and NAME_sft.json (peft's log-probs), which tests/parity.rs checks
Concord against.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

import peft
from peft import LoraConfig, PeftModel, get_peft_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIX = os.path.join(ROOT, "tests", "fixtures", "parity")

ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]

# Tiny shapes: tied and untied embeddings, GQA ratios 2 / 4 / 1 (MHA) / 4 (MQA), a sharded
# checkpoint and a bf16 checkpoint; then the Qwen3 and Llama 3 families (spec key `family`,
# default qwen2). Vocabulary is the family tokenizer's real one (Qwen 151,936, Llama 3 128,256).
MODELS = [
    dict(name="tied_gqa2", spec=dict(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=128,
                                     seed=11, dtype="f32", tie=True, shards=1),
         lora=dict(r=4, alpha=8, targets=ALL, rslora=False), grads=True),
    dict(name="untied_gqa4", spec=dict(hidden=64, layers=2, heads=8, kv_heads=2, intermediate=96,
                                       seed=12, dtype="f32", tie=False, shards=1),
         lora=dict(r=8, alpha=16, targets=["q_proj", "v_proj"], rslora=True), grads=True),
    dict(name="mha_sharded", spec=dict(hidden=48, layers=3, heads=4, kv_heads=4, intermediate=64,
                                       seed=13, dtype="f32", tie=False, shards=3),
         lora=dict(r=2, alpha=4, targets=["o_proj", "gate_proj", "up_proj", "down_proj"],
                   rslora=False), grads=False),
    dict(name="bf16_mqa", spec=dict(hidden=64, layers=2, heads=4, kv_heads=1, intermediate=128,
                                    seed=14, dtype="bf16", tie=True, shards=1),
         lora=dict(r=4, alpha=8, targets=["q_proj", "k_proj", "v_proj", "o_proj"], rslora=False),
         grads=False),
    # Qwen3: per-head q/k RMSNorm, no q/k/v bias, an explicit head_dim (32 here, not
    # hidden/heads; qwen3_untied leaves it at its default, hidden/heads).
    dict(name="qwen3_tied", spec=dict(family="qwen3", hidden=64, layers=2, heads=4, kv_heads=2,
                                      head_dim=32, intermediate=128, seed=21, dtype="f32",
                                      tie=True, shards=1),
         lora=dict(r=4, alpha=8, targets=ALL, rslora=False), grads=True),
    dict(name="qwen3_untied", spec=dict(family="qwen3", hidden=64, layers=2, heads=8, kv_heads=2,
                                        intermediate=128, seed=22, dtype="f32", tie=False,
                                        shards=1),
         lora=dict(r=8, alpha=16, targets=["q_proj", "v_proj"], rslora=True), grads=True),
    # Llama 3: no biases, the real Llama 3 tokenizer, llama3 RoPE scaling with a small
    # original window (32 positions) so that it changes the log-probs of these short cases.
    dict(name="llama_tied_scaled", spec=dict(family="llama", hidden=64, layers=2, heads=4,
                                             kv_heads=2, intermediate=128, seed=23, dtype="f32",
                                             tie=True, shards=1,
                                             rope_scaling=dict(
                                                 factor=8.0, low_freq_factor=1.0,
                                                 high_freq_factor=4.0,
                                                 original_max_position_embeddings=32)),
         lora=dict(r=4, alpha=8, targets=["q_proj", "k_proj", "v_proj", "o_proj"],
                   rslora=False), grads=True),
    dict(name="llama_untied", spec=dict(family="llama", hidden=64, layers=2, heads=8, kv_heads=2,
                                        intermediate=128, seed=24, dtype="f32", tie=False,
                                        shards=1),
         lora=dict(r=8, alpha=16, targets=ALL, rslora=False), grads=True),
]

# The transformers class each family's checkpoint must load as.
ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "llama": "LlamaForCausalLM"}

# Chat-template variables per family, for every prompt the fixtures render. Qwen3: no
# thinking (Concord's default for training prompts). Llama 3.x: the date its template falls
# back to without strftime_now (transformers would render today's date and the fixtures
# would change every day).
TEMPLATE_KWARGS = {"qwen2": {}, "qwen3": {"enable_thinking": False},
                   "llama": {"date_string": "26 Jul 2024"}}

LLAMA_BOS = 128000  # <|begin_of_text|>

# (messages, completion) cases scored by every model.
CASES = [
    ([{"role": "user", "content": "Hello!"}], "Hi there, how can I help?"),
    ([{"role": "system", "content": "You are a terse assistant."},
      {"role": "user", "content": "What is 2+2?"}], "4"),
    ([{"role": "user", "content": "Grüße aus Köln — 你好，世界! 🎉"}],
     "Danke! 谢谢 😊\n\nBis bald."),
    ([{"role": "system", "content": "Play the merge game."},
      {"role": "user", "content": "Your move?"},
      {"role": "assistant", "content": "I pick ring 3."},
      {"role": "user", "content": "Why?"}], "Because  it   merges\twith ring 2.<|im_end|>"),
]

# Conversations for the chat-template fixtures (rendered with and without generation prompt).
CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are a terse assistant."},
     {"role": "user", "content": "What is 2+2?"}],
    [{"role": "user", "content": "Grüße aus Köln — 你好，世界! 🎉 ñ\u00a0é"}],
    [{"role": "system", "content": "Play the merge game."},
     {"role": "user", "content": "Your move?"},
     {"role": "assistant", "content": "I pick ring 3."},
     {"role": "user", "content": "Why?"}],
    [{"role": "user", "content": "  leading spaces\n\n\ntrailing  "},
     {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nThe answer is 4."},
     {"role": "user", "content": "And 3+3?"},
     {"role": "assistant", "content": "6"}],
    [{"role": "user", "content": "line\r\nbreaks and <|im_start|> literal"},
     {"role": "assistant", "content": "ok"}],
]

ENCODE_TEXTS = [
    "Hello, world!",
    "  leading spaces and trailing   ",
    "numbers 1234567 and 3.14159",
    "line\n\n\nbreaks\r\n\ttabs",
    "Grüße 你好 🎉 ñ",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "don't won't I'm we'll THEY'RE",
]

GREEDY_NEW_TOKENS = 10


def run(cmd):
    print("+", " ".join(cmd), file=sys.stderr)
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def init_tiny(concord, spec, out):
    args = [concord, "model", "init-tiny", "--out", out,
            "--hidden", str(spec["hidden"]), "--layers", str(spec["layers"]),
            "--heads", str(spec["heads"]), "--kv-heads", str(spec["kv_heads"]),
            "--intermediate", str(spec["intermediate"]), "--seed", str(spec["seed"]),
            "--dtype", spec["dtype"], "--shards", str(spec["shards"]),
            "--tie" if spec["tie"] else "--no-tie"]
    # Optional keys, passed only when the spec has them (the Qwen2 specs predate them).
    if "family" in spec:
        args += ["--family", spec["family"]]
    if "head_dim" in spec:
        args += ["--head-dim", str(spec["head_dim"])]
    if "vocab" in spec:
        args += ["--vocab", str(spec["vocab"])]
    if "rope_scaling" in spec:
        rs = spec["rope_scaling"]
        args += ["--rope-scaling", ",".join(str(rs[k]) for k in (
            "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"))]
    run(args)


def family(spec):
    return spec.get("family", "qwen2")


def encode(tok, text):
    # Without special tokens: a chat template writes them itself (Llama's
    # <|begin_of_text|> included), so the post-processor must not add a second BOS.
    return tok(text, add_special_tokens=False)["input_ids"]


def check_bos(fam, ids, what):
    """Llama: the ids start with exactly one <|begin_of_text|> (the template's own)."""
    if fam == "llama":
        assert ids[:1] == [LLAMA_BOS] and ids.count(LLAMA_BOS) == 1, (what, ids[:4])


def prompt_ids(tok, messages, fam="qwen2", template=None):
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                   chat_template=template, **TEMPLATE_KWARGS[fam])
    ids = encode(tok, text)
    check_bos(fam, ids, messages)
    return text, ids


def load_base(mdir, spec):
    """The checkpoint in transformers (f32), checked to be read as the family's own class
    with every tensor used and the spec's head_dim, tying and RoPE: a checkpoint that
    transformers reads as another family, or with tensors dropped or left at random init,
    would give fixtures of some other model. Returns (model, class name)."""
    fam = family(spec)
    model, info = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32,
                                                       output_loading_info=True)
    arch = type(model).__name__
    assert arch == ARCHITECTURES[fam], f"{mdir}: a {fam} checkpoint loaded as {arch}"
    cfg = model.config
    assert cfg.model_type == fam, (mdir, cfg.model_type)
    for k in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        assert not info.get(k), f"{mdir}: {k} {sorted(info[k])}"
    want_hd = spec.get("head_dim", spec["hidden"] // spec["heads"])
    got_hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    assert got_hd == want_hd, f"{mdir}: head_dim {got_hd}, spec {want_hd}"
    assert bool(cfg.tie_word_embeddings) == spec["tie"], (mdir, cfg.tie_word_embeddings)
    rope = dict(getattr(cfg, "rope_parameters", None) or {})
    if "rope_scaling" in spec:
        assert rope.get("rope_type") == "llama3", (mdir, rope)
        for k, v in spec["rope_scaling"].items():
            assert rope.get(k) == v, f"{mdir}: rope {k} {rope.get(k)}, spec {v}"
    else:
        assert rope.get("rope_type", "default") == "default", (mdir, rope)
    model.eval()
    return model, arch


def check_tokenizer(tok, model, mdir):
    # Every id the tokenizer can give has an embedding row (when tokenizer_config.json's
    # added tokens disagree with tokenizer.json, transformers appends new ids).
    assert len(tok) <= model.config.vocab_size, (mdir, len(tok), model.config.vocab_size)


@torch.no_grad()
def logprobs(model, p_ids, c_ids):
    ids = torch.tensor([p_ids + c_ids])
    logits = model(input_ids=ids).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    n = len(p_ids)
    return [lp[n - 1 + i, c].item() for i, c in enumerate(c_ids)]


@torch.no_grad()
def greedy(model, p_ids, n_new):
    ids = list(p_ids)
    out, gap = [], float("inf")
    for _ in range(n_new):
        logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        top = torch.topk(logits, 2)
        gap = min(gap, (top.values[0] - top.values[1]).item())
        nxt = int(top.indices[0])
        out.append(nxt)
        ids.append(nxt)
    return out, gap


def rope_scaling_effect(mdir, cases):
    """Max |Δ| of the cases' base log-probs when the checkpoint's RoPE scaling is left out."""
    cfg = AutoConfig.from_pretrained(mdir)
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": cfg.rope_parameters["rope_theta"]}
    plain = AutoModelForCausalLM.from_pretrained(mdir, config=cfg, dtype=torch.float32)
    plain.eval()
    return max(max(abs(a - b) for a, b in zip(
        logprobs(plain, c["prompt_ids"], c["completion_ids"]), c["logprobs_base"]))
        for c in cases)


def lora_config(lora, base):
    return LoraConfig(r=lora["r"], lora_alpha=lora["alpha"], target_modules=lora["targets"],
                      lora_dropout=0.0, bias="none", use_rslora=lora["rslora"],
                      task_type="CAUSAL_LM", base_model_name_or_path=base)


def randomize_b(model, seed):
    """Nonzero B (peft initialises it to zero) so the adapter changes the output."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def peft_key(name):
    # In-model names carry the adapter name (".default"); the saved format does not.
    return name.replace(".default", "")


def make_model_fixture(concord, entry, work):
    name, spec, lora = entry["name"], entry["spec"], entry["lora"]
    fam = family(spec)
    mdir = os.path.join(work, name)
    init_tiny(concord, spec, mdir)
    tok = AutoTokenizer.from_pretrained(mdir)
    base, arch = load_base(mdir, spec)
    check_tokenizer(tok, base, mdir)

    cases = []
    for messages, completion in CASES:
        _, p = prompt_ids(tok, messages, fam)
        c = encode(tok, completion)
        cases.append(dict(messages=messages, completion=completion, prompt_ids=p,
                          completion_ids=c, logprobs_base=logprobs(base, p, c)))
    if "rope_scaling" in spec:
        # The scaling must matter for these cases, or the fixture would not test it.
        rope_effect = rope_scaling_effect(mdir, cases)
        assert rope_effect > 1e-2, f"{name}: RoPE scaling moves log-probs by {rope_effect} only"
    for case in cases:
        case["greedy_base"], case["greedy_base_min_gap"] = greedy(base, case["prompt_ids"],
                                                                GREEDY_NEW_TOKENS)

    torch.manual_seed(spec["seed"])
    pm = get_peft_model(base, lora_config(lora, mdir))
    randomize_b(pm, spec["seed"] + 1000)
    pm.eval()
    for case in cases:
        case["logprobs_lora"] = logprobs(pm, case["prompt_ids"], case["completion_ids"])
        case["greedy_lora"], case["greedy_lora_min_gap"] = greedy(pm, case["prompt_ids"],
                                                                GREEDY_NEW_TOKENS)
    adir = os.path.join(FIX, f"{name}_adapter")
    shutil.rmtree(adir, ignore_errors=True)
    pm.save_pretrained(adir)
    # The base path is a temporary directory; record the spec instead.
    cfg_path = os.path.join(adir, "adapter_config.json")
    with open(cfg_path) as f:
        acfg = json.load(f)
    acfg["base_model_name_or_path"] = f"concord-tiny/{name}"
    with open(cfg_path, "w") as f:
        json.dump(acfg, f, indent=2, sort_keys=True)
    readme = os.path.join(adir, "README.md")
    if os.path.exists(readme):
        os.remove(readme)

    fixture = dict(name=name, spec=spec, architecture=arch, lora=lora,
                   greedy_new_tokens=GREEDY_NEW_TOKENS,
                   transformers=__import__("transformers").__version__,
                   peft=peft.__version__, torch=torch.__version__, cases=cases)
    if TEMPLATE_KWARGS[fam]:
        fixture["chat_template_kwargs"] = TEMPLATE_KWARGS[fam]
    if "rope_scaling" in spec:
        fixture["rope_scaling_max_abs_effect"] = rope_effect

    if entry["grads"]:
        # loss = -(sum of completion log-probs over all cases) / (completion tokens)
        pm.train()
        for p in pm.parameters():
            p.grad = None
        total = sum(len(c["completion_ids"]) for c in cases)
        loss = 0.0
        for case in cases:
            ids = torch.tensor([case["prompt_ids"] + case["completion_ids"]])
            lp = torch.log_softmax(pm(input_ids=ids).logits[0].float(), dim=-1)
            n = len(case["prompt_ids"])
            tgt = torch.tensor(case["completion_ids"])
            pos = torch.arange(n - 1, n - 1 + len(tgt))
            loss = loss - lp[pos, tgt].sum() / total
        loss.backward()
        grads = {peft_key(n): p.grad.detach().float().contiguous()
                 for n, p in pm.named_parameters() if "lora_" in n}
        save_file(grads, os.path.join(FIX, f"{name}_grads.safetensors"))
        fixture["grad_loss"] = loss.item()
        fixture["grad_note"] = ("loss = -(sum over cases of sum_i logprobs_lora[i]) / "
                                "total completion tokens; grads keyed like the peft file")

    with open(os.path.join(FIX, f"{name}.json"), "w") as f:
        json.dump(fixture, f, ensure_ascii=False, indent=1)
    print(f"{name}: {len(cases)} cases, min greedy gap "
          f"{min(min(c['greedy_base_min_gap'], c['greedy_lora_min_gap']) for c in cases):.4f}",
          file=sys.stderr)
    return mdir, base


def make_chat_fixture(mdir):
    tok = AutoTokenizer.from_pretrained(mdir)
    with open(os.path.join(FIX, "qwen3_tokenizer_config.json")) as f:
        qwen3_template = json.load(f)["chat_template"]
    rows = []
    for conv in CONVERSATIONS:
        for gen in (True, False):
            row = dict(messages=conv, add_generation_prompt=gen)
            for key, template in (("tiny", None), ("qwen3", qwen3_template)):
                text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen,
                                               chat_template=template)
                row[f"{key}_text"] = text
                row[f"{key}_ids"] = tok(text, add_special_tokens=False)["input_ids"]
            rows.append(row)
    enc = [dict(text=t, ids=tok(t, add_special_tokens=False)["input_ids"]) for t in ENCODE_TEXTS]
    for e in enc:
        e["decoded"] = tok.decode(e["ids"])
    with open(os.path.join(FIX, "chat.json"), "w") as f:
        json.dump(dict(conversations=rows, encode=enc), f, ensure_ascii=False, indent=1)


def make_family_chat_fixture(entry, mdir):
    """FAMILY_chat.json: the conversations through the checkpoint's own tokenizer and chat
    template (`chat_template=None`), with and without the generation prompt."""
    fam = family(entry["spec"])
    tok = AutoTokenizer.from_pretrained(mdir)
    variants = [("", {})]
    if fam == "qwen3":
        variants = [("", {"enable_thinking": False}), ("_thinking", {"enable_thinking": True})]
    rows = []
    for conv in CONVERSATIONS:
        for gen in (True, False):
            row = dict(messages=conv, add_generation_prompt=gen)
            for suffix, kw in variants:
                text = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen,
                                               chat_template=None,
                                               **dict(TEMPLATE_KWARGS[fam], **kw))
                ids = encode(tok, text)
                check_bos(fam, ids, (conv, gen))
                row[f"text{suffix}"] = text
                row[f"ids{suffix}"] = ids
            rows.append(row)
    out = dict(family=fam, model=entry["name"],
               transformers=__import__("transformers").__version__,
               chat_template_kwargs=TEMPLATE_KWARGS[fam], conversations=rows)
    if fam == "qwen3":
        out["note"] = "text/ids: enable_thinking=False; text_thinking/ids_thinking: True"
    if fam == "llama":
        enc = []
        for t in ENCODE_TEXTS:
            ids = encode(tok, t)
            # With special tokens the tokenizer's post-processor prepends one BOS.
            with_bos = tok(t)["input_ids"]
            assert with_bos == [LLAMA_BOS] + ids, (t, with_bos[:3])
            enc.append(dict(text=t, ids=ids, ids_with_bos=with_bos, decoded=tok.decode(ids)))
        out["encode"] = enc
    with open(os.path.join(FIX, f"{fam}_chat.json"), "w") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
    print(f"{fam}_chat.json: {len(rows)} rows from {entry['name']}", file=sys.stderr)


def concord_checks(concord, entry, mdir, work):
    """`concord score` vs transformers, and a Concord-saved adapter loaded in peft."""
    name, spec, lora = entry["name"], entry["spec"], entry["lora"]
    with open(os.path.join(FIX, f"{name}.json")) as f:
        fixture = json.load(f)
    tol = 1e-3 if spec["dtype"] == "f32" else 0.1
    cdir = os.path.join(work, f"{name}_concord_adapter")
    run([concord, "model", "init-adapter", "--model", mdir, "--out", cdir,
         "--r", str(lora["r"]), "--alpha", str(lora["alpha"]),
         "--targets", ",".join(lora["targets"]), "--seed", str(spec["seed"] + 7),
         "--b-std", "0.2"] + (["--rslora"] if lora["rslora"] else []))
    base, _ = load_base(mdir, spec)
    pm = PeftModel.from_pretrained(base, cdir)
    pm.eval()
    worst = {"score_base": 0.0, "score_concord_adapter": 0.0}
    for i, case in enumerate(fixture["cases"]):
        mfile = os.path.join(work, f"{name}_{i}.json")
        with open(mfile, "w") as f:
            json.dump(case["messages"], f, ensure_ascii=False)
        out = json.loads(run([concord, "score", "--model", mdir, "--messages", mfile,
                              "--completion", case["completion"]]))
        assert out["prompt_ids"] == case["prompt_ids"], (name, i, "prompt ids")
        assert out["completion_ids"] == case["completion_ids"], (name, i, "completion ids")
        d = max(abs(a - b) for a, b in zip(out["logprobs"], case["logprobs_base"]))
        worst["score_base"] = max(worst["score_base"], d)
        out = json.loads(run([concord, "score", "--model", mdir, "--adapter", cdir,
                              "--messages", mfile, "--completion", case["completion"]]))
        ref = logprobs(pm, case["prompt_ids"], case["completion_ids"])
        d = max(abs(a - b) for a, b in zip(out["logprobs"], ref))
        worst["score_concord_adapter"] = max(worst["score_concord_adapter"], d)
    print(f"{name}: concord checks max |dlogprob| {worst} (tolerance {tol})", file=sys.stderr)
    for k, v in worst.items():
        assert v <= tol, f"{name}: {k} max |dlogprob| {v} > {tol}"
    return worst


def sft_adapter_check(concord, entry, mdir, work):
    """An adapter trained by `concord sft` loads in peft with equal log-probs."""
    name = entry["name"]
    with open(os.path.join(FIX, f"{name}.json")) as f:
        fixture = json.load(f)
    data = os.path.join(work, f"{name}_sft.jsonl")
    with open(data, "w") as f:
        for case in fixture["cases"]:
            f.write(json.dumps({"messages": case["messages"],
                                "completion": case["completion"]}, ensure_ascii=False) + "\n")
    lora = entry["lora"]
    cfg = os.path.join(work, f"{name}_sft.toml")
    with open(cfg, "w") as f:
        f.write(f"""[run]
name = "{name}_sft"
output_dir = "{work}"
save_every = 0
[model]
name = "{mdir}"
[lora]
r = {lora["r"]}
alpha = {lora["alpha"]}
dropout = 0.0
targets = {json.dumps(lora["targets"])}
use_rslora = {"true" if lora["rslora"] else "false"}
[sft]
source = "jsonl"
path = "{data}"
steps = 5
batch_size = 2
learning_rate = 1e-2
""")
    run([concord, "sft", "--config", cfg])
    trained = os.path.join(work, f"{name}_sft")
    adir = os.path.join(FIX, f"{name}_sft_adapter")
    shutil.rmtree(adir, ignore_errors=True)
    os.makedirs(adir)
    for fn in ["adapter_model.safetensors", "adapter_config.json"]:
        shutil.copy(os.path.join(trained, fn), adir)
    base, _ = load_base(mdir, entry["spec"])
    pm = PeftModel.from_pretrained(base, adir)
    pm.eval()
    out_cases, worst = [], 0.0
    for i, case in enumerate(fixture["cases"]):
        mfile = os.path.join(work, f"{name}_sft_{i}.json")
        with open(mfile, "w") as f:
            json.dump(case["messages"], f, ensure_ascii=False)
        ours = json.loads(run([concord, "score", "--model", mdir, "--adapter", adir,
                               "--messages", mfile, "--completion", case["completion"]]))
        ref = logprobs(pm, case["prompt_ids"], case["completion_ids"])
        worst = max(worst, max(abs(a - b) for a, b in zip(ours["logprobs"], ref)))
        out_cases.append(dict(prompt_ids=case["prompt_ids"],
                              completion_ids=case["completion_ids"], logprobs_peft=ref))
    with open(os.path.join(FIX, f"{name}_sft.json"), "w") as f:
        json.dump(dict(peft=peft.__version__, max_abs_delta=worst, cases=out_cases), f)
    print(f"{name}: concord sft adapter in peft, max |dlogprob| {worst}", file=sys.stderr)
    assert worst <= 1e-3, f"{name}: sft adapter max |dlogprob| {worst} > 1e-3"
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--concord", default=os.path.join(ROOT, "target", "release", "concord"))
    ap.add_argument("--skip-concord-checks", action="store_true")
    ap.add_argument("--keep", help="keep the tiny models in this directory")
    ap.add_argument("--only", help="comma-separated model names: run just these (default all)")
    ap.add_argument("--sft-only", action="store_true",
                    help="only the `concord sft` adapter check (on --sft-model)")
    ap.add_argument("--sft-model", default=MODELS[0]["name"],
                    help="the model of --sft-only (default %(default)s)")
    args = ap.parse_args()
    by_name = {e["name"]: e for e in MODELS}
    names = [n.strip() for n in (args.only or "").split(",") if n.strip()]
    unknown = [n for n in names + [args.sft_model] if n not in by_name]
    if unknown:
        ap.error(f"unknown model {', '.join(unknown)} (models: {', '.join(by_name)})")
    selected = [e for e in MODELS if e["name"] in names] if names else MODELS
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    os.makedirs(FIX, exist_ok=True)
    work = args.keep or tempfile.mkdtemp(prefix="concord-parity-")
    os.makedirs(work, exist_ok=True)
    try:
        if args.sft_only:
            entry = by_name[args.sft_model]
            mdir = os.path.join(work, entry["name"])
            init_tiny(args.concord, entry["spec"], mdir)
            sft_adapter_check(args.concord, entry, mdir, work)
            return
        dirs = {}
        for entry in selected:
            dirs[entry["name"]], _ = make_model_fixture(args.concord, entry, work)
        # chat.json comes from the first (Qwen2) model; each other family writes its own
        # FAMILY_chat.json from its first model run.
        if MODELS[0]["name"] in dirs:
            make_chat_fixture(dirs[MODELS[0]["name"]])
        done = set()
        for entry in selected:
            fam = family(entry["spec"])
            if fam != "qwen2" and fam not in done:
                make_family_chat_fixture(entry, dirs[entry["name"]])
                done.add(fam)
        if not args.skip_concord_checks:
            path = os.path.join(FIX, "concord_checks.json")
            report = {}
            if names and os.path.exists(path):
                # Only some models run: keep the others' entries as they are.
                with open(path) as f:
                    report = json.load(f)
            for entry in selected:
                report[entry["name"]] = concord_checks(args.concord, entry, dirs[entry["name"]],
                                                       work)
            with open(path, "w") as f:
                json.dump(report, f, indent=1)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
