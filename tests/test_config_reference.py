"""The config reference: field docstrings are read from the dataclasses, and docs/config.md is generated from them."""

from dataclasses import dataclass
from pathlib import Path

from asyncrl.config.reference import field_docs, keys, render_markdown, render_text
from asyncrl.config.run import RunConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "config.md"


@dataclass(kw_only=True, slots=True)
class _Sample:
    a: int = 1
    """The first
    knob."""
    b: str = "x"
    c: float = 0.5  # a comment is not a doc
    """Third."""


def test_field_docs_reads_the_string_under_each_field():
    assert field_docs(_Sample) == {"a": "The first knob.", "c": "Third."}


def test_every_run_config_key_is_listed_with_its_type_and_default():
    listed = {k.name: k for k in keys(RunConfig())}
    assert listed["learner.steps"].type == "int" and listed["model.path"].value == "embedded"
    assert "A Hugging Face causal-LM folder" in listed["model.path"].doc
    text = render_text(RunConfig())
    assert all(f"{name} = " in text for name in listed)


def test_docs_config_md_is_generated_from_the_dataclasses():
    assert DOC.read_text() == render_markdown(RunConfig()), (
        "docs/config.md is out of date with the config dataclasses; regenerate it with\n"
        "    python -m asyncrl.config.reference > docs/config.md")
