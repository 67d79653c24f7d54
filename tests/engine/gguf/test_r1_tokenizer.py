"""DeepSeek-R1-Distill-Qwen's tokenizer from its GGUF header: control tokens spelled in
non-ASCII (`<｜User｜>`, fullwidth bars) keep their own ids and are matched whole."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tokenizers import Tokenizer

from mlx_serve.engine.gguf.reader import read_gguf
from mlx_serve.engine.gguf.tokenizer import write_tokenizer
from tests.support.models import R1_PACKAGE


def test_r1_control_tokens_keep_their_ids(tmp_path: Path) -> None:
    spec = importlib.util.find_spec(R1_PACKAGE)
    assert spec is not None and spec.submodule_search_locations
    gguf = read_gguf(Path(spec.submodule_search_locations[0]) / "model_part_0000")
    write_tokenizer(gguf, tmp_path, 4096)
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    text = "<｜begin▁of▁sentence｜><｜User｜>hi<｜Assistant｜><think>\n"
    assert tokenizer.encode(text, add_special_tokens=False).ids == [151646, 151644, 6023, 151645, 151648, 198]
    assert tokenizer.get_vocab_size() == len(gguf.metadata["tokenizer.ggml.tokens"])  # no token added anew
    assert tokenizer.decode([151644, 6023], skip_special_tokens=False) == "<｜User｜>hi"
