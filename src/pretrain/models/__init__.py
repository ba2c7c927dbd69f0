"""Model families: ids -> hidden states (encoders) and hidden states -> predictions (heads).

Nothing here knows about objectives; an objective composes an encoder and heads. The
families' settings are in `configs.py` (torch-free), building an encoder in `build.py`.
"""
