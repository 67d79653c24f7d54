"""What a model listing says of a model (engine.model.facts): Ollama's spelling of a parameter
count, and the facts of the real default GGUF, against its own tensor table read by the `gguf`
package (llama.cpp's reader)."""

from __future__ import annotations

import pytest

from mlx_serve.engine.model.facts import model_facts, parameter_size


@pytest.mark.parametrize(
    ("count", "spelled"),
    [
        (134_515_008, "134.52M"),
        (494_032_768, "494.03M"),
        (22_000_000, "22M"),
        (1_543_714_304, "1.5B"),
        (8_000_000_000, "8B"),
        (7_615_616_512, "7.6B"),
        (999, "999"),
    ],
)
def test_parameter_size_is_spelled_as_ollama_spells_it(count: int, spelled: str) -> None:
    assert parameter_size(count) == spelled


def test_the_default_gguf_s_facts_are_its_file_its_tensors_and_its_file_type() -> None:
    import gguf

    from mlx_serve.engine.model.loader import default_gguf

    path = default_gguf()
    reader = gguf.GGUFReader(path)
    facts = model_facts(path)
    assert facts is not None
    assert facts.file_bytes == path.stat().st_size
    assert facts.parameters == sum(int(t.n_elements) for t in reader.tensors) == 134_515_008
    assert facts.quantization == "Q4_1"  # llama.cpp's file type 3: SmolLM2-135M-Instruct.Q4_1.gguf
