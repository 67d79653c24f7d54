"""A real Hugging Face tokenizer with no model behind it: one token per byte, a ChatML template.

Built in memory (no download): transformers' own apply_chat_template and Jinja sandbox render
the template, with `tools | tojson`, `enable_thinking` and a generation prompt, as a real
model's template does; mlx-lm's TokenizerWrapper wraps it as the engine loads one.
"""

from __future__ import annotations

from typing import Any

CHATML = (
    "{%- if tools %}<|im_start|>system\nYou may call these tools:\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}{%- endfor %}<|im_end|>\n{% endif %}"
    "{%- for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}"
    "{%- if message.tool_calls %}{%- for call in message.tool_calls %}"
    "<tool_call>{{ call.function | tojson }}</tool_call>{%- endfor %}{%- endif %}<|im_end|>\n"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and not enable_thinking %}<think></think>{%- endif %}{%- endif %}"
)
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>"]


def byte_tokenizer(chat_template: str = CHATML) -> Any:
    """mlx-lm's TokenizerWrapper over a byte-level BPE with no merges (vocab: 256 + specials)."""
    from mlx_lm.tokenizer_utils import TokenizerWrapper
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    core = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    hf = PreTrainedTokenizerFast(tokenizer_object=core, chat_template=chat_template)
    hf.add_special_tokens({"eos_token": "<|im_end|>", "additional_special_tokens": SPECIALS})
    return TokenizerWrapper(hf)
