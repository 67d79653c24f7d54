"""The GGUF loader on qwen2: the real Qwen2.5-Coder-0.5B-Instruct (Q4_K_M: Q5_0, Q8_0, Q4_K, Q6_K).

Converted once into the user cache (`--model qwen2.5-coder-0.5b`), like a server would. The
oracle for the weights is mlx-lm's own `qwen2` model loaded with every GGUF tensor
dequantized by the `gguf` package under hand-mapped names: no repacking, no converter.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from gguf.quants import dequantize
from mlx.utils import tree_flatten
from mlx_lm import stream_generate
from mlx_lm.models import qwen2
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from mlx_serve.engine.gguf.reader import read_gguf
from mlx_serve.engine.model.loader import maybe_dequantize, shortcut_gguf
from mlx_serve.engine.tools.formats import tool_format_for
from mlx_serve.engine.tools.json_calls import JsonCalls
from tests.engine.gguf.gguf_reference import TRICKY_STRINGS, load_model, reference_tokenizer
from tests.support.models import qwen_folder

pytestmark = pytest.mark.real

NFC_STRINGS = [t for t in TRICKY_STRINGS if unicodedata.normalize("NFC", t) == t]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
_ORACLE_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}  # fmt: skip


@pytest.fixture(scope="module")
def qwen_gguf() -> Path:
    return shortcut_gguf("qwen2.5-coder-0.5b")


@pytest.fixture(scope="module")
def qwen_dir() -> Path:
    return qwen_folder("qwen2.5-coder-0.5b")


@pytest.fixture(scope="module")
def qwen(qwen_dir: Path) -> tuple[Any, Any]:
    """As the server runs it on a CPU: float32."""
    model, tokenizer = load_model(qwen_dir)
    return maybe_dequantize(model, "always"), tokenizer


@pytest.fixture(scope="module")
def oracle(qwen_gguf: Path, qwen_dir: Path) -> Any:
    return oracle_model(qwen_gguf, json.loads((qwen_dir / "config.json").read_text()))


def oracle_model(gguf_path: Path, config: dict[str, Any]) -> Any:
    """mlx-lm's qwen2 with the file's tensors dequantized by `gguf` (float32), names mapped by hand."""
    gguf = read_gguf(gguf_path)
    weights = []
    for name, info in gguf.tensors.items():
        parts = name.split(".")
        if parts[0] == "blk":
            mlx_name = f"model.layers.{parts[1]}.{_ORACLE_NAMES[parts[2]]}.{parts[3]}"
        else:
            mlx_name = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}[
                parts[0]
            ] + f".{parts[1]}"
        weights.append((mlx_name, mx.array(dequantize(gguf.raw(name), info.ggml_type))))
    model = qwen2.Model(qwen2.ModelArgs.from_dict(config))  # type: ignore[no-untyped-call]
    model.load_weights(weights)  # strict: every parameter, no extra
    mx.eval(model.parameters())
    return model


def greedy_tokens(model: Any, tokenizer: Any, prompt: list[int], n: int) -> list[int]:
    return [r.token for r in stream_generate(model, tokenizer, prompt, max_tokens=n)]


def test_qwen2_config(qwen_dir: Path) -> None:
    config = json.loads((qwen_dir / "config.json").read_text())

    assert config["model_type"] == "qwen2"
    assert (config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"]) == (
        24,
        896,
        4864,
    )
    assert (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]) == (14, 2, 64)
    assert (config["vocab_size"], config["max_position_embeddings"]) == (151936, 32768)
    assert config["rope_theta"] == 1e6 and config["rope_scaling"] is None
    assert config["tie_word_embeddings"] is False  # this file keeps its own output matrix (Q8_0)
    assert (config["bos_token_id"], config["eos_token_id"]) == (151643, 151645)
    quant = config["quantization"]
    assert (quant["bits"], quant["group_size"]) == (5, 32)  # Q5_0: repacked
    assert quant["lm_head"]["bits"] == 8  # Q8_0
    assert quant["model.layers.0.mlp.down_proj"] is False  # Q6_K: float32
    assert quant["model.layers.2.mlp.down_proj"]["bits"] == 4  # Q4_K: repacked


def test_qwen2_weights_equal_the_gguf_packages_own_dequantization(qwen: tuple[Any, Any], oracle: Any) -> None:
    ours = dict(tree_flatten(qwen[0].parameters()))
    theirs = dict(tree_flatten(oracle.parameters()))

    assert ours.keys() == theirs.keys()
    for name, value in theirs.items():
        assert ours[name].dtype == value.dtype == mx.float32, name
        assert mx.array_equal(ours[name], value).item(), name


def test_qwen2_greedy_matches_mlx_lm_qwen2_token_for_token(qwen: tuple[Any, Any], oracle: Any) -> None:
    model, tokenizer = qwen
    messages = [{"role": "user", "content": "Write a Python function that reverses a string."}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    ours = greedy_tokens(model, tokenizer, prompt, 24)

    assert ours == greedy_tokens(oracle, tokenizer, prompt, 24)
    assert "def " in tokenizer.decode(ours)


def test_qwen2_answers_the_capital_of_france(qwen: tuple[Any, Any]) -> None:
    model, tokenizer = qwen
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)

    tokens = greedy_tokens(model, tokenizer, prompt, 12)

    assert tokenizer.decode(tokens) == "The capital of France is Paris.<|im_end|>"


def test_qwen2_tokenizer_matches_transformers(qwen_gguf: Path, qwen_dir: Path) -> None:
    reference = reference_tokenizer(qwen_gguf)
    ours = AutoTokenizer.from_pretrained(str(qwen_dir))

    for text in NFC_STRINGS:
        for special in (True, False):
            ids = ours.encode(text, add_special_tokens=special)
            assert ids == reference.encode(text, add_special_tokens=special), text
        assert ours.decode(ids) == reference.decode(ids) == text
    assert ours.encode("2024") == [17, 15, 17, 19]  # one digit a token
    assert ours.encode("<|im_start|><tool_call>") == [151644, 151657]
    assert (ours.bos_token, ours.eos_token, ours.pad_token) == (
        "<|endoftext|>",
        "<|im_end|>",
        "<|endoftext|>",
    )
    assert ours.chat_template == reference.chat_template


def test_qwen2_tokenizer_normalizes_to_nfc_as_qwen2s_own_does(qwen_gguf: Path, qwen_dir: Path) -> None:
    # Qwen2's tokenizer.json starts with an NFC normalizer, and transformers rebuilds that for a
    # qwen2 folder whatever its tokenizer.json says; a GGUF has no place for it, so transformers'
    # GGUF conversion (and llama.cpp) skip it. Ours keeps it: only text not in NFC differs.
    reference = reference_tokenizer(qwen_gguf)
    written = Tokenizer.from_file(str(qwen_dir / "tokenizer.json"))
    ours = AutoTokenizer.from_pretrained(str(qwen_dir))

    for text in (t for t in TRICKY_STRINGS if t not in NFC_STRINGS):
        nfc = unicodedata.normalize("NFC", text)
        assert (
            ours.encode(text) == written.encode(text).ids == reference.encode(nfc) != reference.encode(text)
        )
        assert ours.decode(ours.encode(text)) == nfc
    for text in NFC_STRINGS:
        assert written.encode(text).ids == ours.encode(text), text


def test_qwen2_tokenizers_of_both_sizes_are_identical(qwen_gguf: Path) -> None:
    small, large = read_gguf(qwen_gguf), read_gguf(shortcut_gguf("qwen2.5-coder-1.5b"))
    keys = [k for k in small.metadata if k.startswith("tokenizer.ggml.")]

    assert len(keys) == 9
    for key in keys:
        assert np.array_equal(small.metadata[key], large.metadata[key]), key


def test_qwen2_streams_with_the_bpe_detokenizer(qwen: tuple[Any, Any]) -> None:
    _, tokenizer = qwen
    assert isinstance(tokenizer.detokenizer, BPEStreamingDetokenizer)
    detokenizer: Any = tokenizer.detokenizer
    for text in (t for t in NFC_STRINGS if not t.startswith(" ")):
        detokenizer.reset()
        for token in tokenizer.encode(text, add_special_tokens=False):
            detokenizer.add_token(token)
        detokenizer.finalize()
        assert detokenizer.text == text


def test_qwen2_chat_template_offers_tools_and_replays_calls(qwen: tuple[Any, Any]) -> None:
    _, tokenizer = qwen
    call = {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": '{"temperature_c": 21}'},
    ]

    text = tokenizer.apply_chat_template(
        messages, tools=[WEATHER_TOOL], add_generation_prompt=True, tokenize=False
    )

    assert "# Tools" in text and f"<tools>\n{json.dumps(WEATHER_TOOL)}\n</tools>" in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    assert '<|im_start|>user\n<tool_response>\n{"temperature_c": 21}\n</tool_response><|im_end|>' in text
    assert text.endswith("<|im_start|>assistant\n")


def test_qwen2_tool_calls_are_read_as_streaming_hermes_json(qwen: tuple[Any, Any]) -> None:
    fmt = tool_format_for(qwen[1])

    # mlx-lm infers its json_tools family from the template; Qwen2.5's gets its own qwen2_5 format:
    # hermes markup, or a bare JSON call opening the answer when it names an offered tool
    assert (fmt.name, fmt.start, fmt.end) == ("qwen2_5", "<tool_call>", "</tool_call>")
    assert isinstance(fmt.body([WEATHER_TOOL]), JsonCalls)
