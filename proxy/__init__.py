"""keyrange-proxy: a Kafka sidecar that lets consumers share a partition by key-hash ranges."""

__version__ = "0.1.0"
