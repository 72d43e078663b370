"""``bfcl``: the Berkeley Function Calling Leaderboard's categories as a taskset (PyPI ``bfcl-eval``).

``taskset.py`` loads the single-turn categories (``load``, the name ``bfcl`` in the registry) and
``multi_turn.py`` the multi-turn ones; ``scoring.py`` and ``multi_turn_scoring.py`` are BFCL's checks as
our own code; ``data.py`` reads bfcl-eval's files. Must not import Prefect.
"""
