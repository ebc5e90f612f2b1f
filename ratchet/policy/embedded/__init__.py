"""The embedded default policy: chat format (`chat`), locally trained tokenizer (`tokenizer`),
documented corpus (`corpus`) and the small Qwen2-style model (`model`). Heavy imports stay inside
functions, so importing this package is cheap."""
