"""Guess sources and the draft tree they fill: the n-gram pool (ngram_pool.py), suffix
match over the row's own text (suffix_match.py), token recycling (token_recycling.py),
the tree and its candidate layout in one forward pass (draft_tree.py,
lookahead_layout.py) and LookaheadConfig, the shape of a step (lookahead_config.py).

Pure array functions of tokens; independent of models/ (they never see a forward).
"""
