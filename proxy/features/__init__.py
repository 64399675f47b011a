"""Small features of the proxy's own: the cluster view's feed and the address rewrite.

The larger features (key-range fetch, individual commit, fetch prediction) are packages of their
own beside this one; all of them implement ``proxy.pipeline.Feature``.
"""
