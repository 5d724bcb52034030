"""Callbacks for training frameworks: :mod:`startline.integrations.lightning` (PyTorch Lightning) and
:mod:`startline.integrations.transformers` (Hugging Face Transformers). Each imports its framework only when
it is imported itself."""
