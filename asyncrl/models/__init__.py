"""Which model every component loads (`config`: `ModelConfig` and the folder it resolves to), checkpoints that
are not Hugging Face folders: GGUF files converted once into one (`gguf`), and the known models
`python -m asyncrl.models fetch` downloads (`registry`, `fetch`). docs/models.md."""
