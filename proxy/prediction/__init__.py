"""Fetch prediction (docs/fetch-prediction.md): the proxy predicts a plain consumer's next
Fetch, sends it to the broker early and answers the consumer from it when it asks."""
