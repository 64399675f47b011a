"""Kafka wire protocol: framing, peeks and the schema-driven message codecs.

The codecs are one pipeline, each stage importing only the ones before it:

1. ``schema`` loads Kafka's JSON message definitions and our overlays (tag 10000);
2. ``values`` generates one dataclass per struct from a definition;
3. ``codec_tree`` lays out one message version as a tree of constructs over the
   ``primitives`` and ``tagged`` readers and writers (the interpreted reference);
4. ``codegen`` turns that tree into straight-line Python functions;
5. ``compiler`` joins tree and code into a ``MessageCodec`` per (message, version);
6. ``messages`` is what the rest of the proxy calls: a registry that maps an
   (api key, version, kind) to its header and body codecs once, plus the public API.

``message_types`` names the generated classes (``FetchRequest``, ``FetchRequest.FetchTopic``)
for the rest of the proxy; its stub ``message_types.pyi`` and the version constants of
``message_versions`` (``FETCH_FIRST_TOPIC_ID``) are generated from the same definitions by
``stubs`` (``python -m proxy.protocol.stubs``), so mypy checks every use of a message field.

``framing`` (size prefixes) and ``peek`` (single fields without a decode) stand beside
the pipeline, stating the fields they read as ``walks.Walk``s that a test checks against
the definitions; ``constants``, ``api_keys`` and ``errors`` are shared leaves.
"""
