"""Cooperative fetch: members of a group share a partition by chunks of offsets
(docs/wire-contract.md#37-cooperative-fetch)."""
