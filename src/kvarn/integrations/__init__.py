"""Optional integrations (need the ``eval`` extra): ``kvarn.integrations.transformers`` (a
transformers Cache with kvarn decode attention) and ``kvarn.integrations.assets`` (the real
models and text that ship in PyPI wheels). Importing this package imports nothing heavy."""
