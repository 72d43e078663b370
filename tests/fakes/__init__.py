"""Test doubles (fake servers) used by the prefect_rollouts test suite."""
