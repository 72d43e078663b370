"""What a model call costs, from the prices the user gives per client (``ClientConfig.price``).

There is no built-in price table: providers change prices and bill cached and reasoning tokens in
their own ways, so a cost exists only where the user wrote a price (USD per million tokens).
Must not import Prefect.
"""

from __future__ import annotations

from prefect_rollouts.config.base import PriceConfig

PER_TOKENS = 1_000_000
"""Prices are USD per this many tokens (providers' own unit)."""


def call_cost_usd(price: PriceConfig | None, prompt_tokens: int, completion_tokens: int,
                  cached_tokens: int | None = None, cache_write_tokens: int | None = None) -> float | None:
    """USD of one call, or None without a price.

    The prompt's tokens bill at ``price.input``, except the ``cached_tokens`` the server served from
    its cache (``price.cached_input``, else ``input``) and the ``cache_write_tokens`` it wrote to it
    (``price.cache_write``, else ``input``); the completion's tokens, reasoning tokens included (they
    are part of ``completion_tokens`` in every dialect we read), bill at ``price.output``. A count the
    server did not report (None) is 0 of its kind. E.g. 10,000 prompt tokens of which 8,000 cached and
    500 completion tokens at ``{input = 3, output = 15, cached_input = 0.3}``: (2,000 x 3 + 8,000 x 0.3
    + 500 x 15) / 1e6 = 0.0159.
    """
    if price is None:
        return None
    cached, written = max(0, cached_tokens or 0), max(0, cache_write_tokens or 0)
    fresh = max(0, prompt_tokens - cached - written)
    cached_price = price.input if price.cached_input is None else price.cached_input
    write_price = price.input if price.cache_write is None else price.cache_write
    return (fresh * price.input + cached * cached_price + written * write_price
            + completion_tokens * price.output) / PER_TOKENS
