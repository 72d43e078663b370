"""A tiny single-account ledger."""
