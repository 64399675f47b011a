"""The commit layer as the server builds it: one individual-commit log
(``__individual_commit_offsets``), read and written through three objects split by what
their callers need, shared by every feature that commits or reads commits:

- ``reads`` (``CommittedReads``): what a group has committed: a partition's (S, R), its
  share watermarks, and what committed transactions hold beyond the log (cooperative
  fetch, individual commit, virtual range topics);
- ``writes`` (``CommitWrites``): range commits, commits of share watermarks, deletions,
  under one set of per-key locks (individual commit, virtual range topics);
- ``transactions`` (``TransactionalCommits``): commits inside Kafka transactions, written
  to shadow groups and folded into the log once the transaction has ended (individual
  commit's offset ranges, virtual range topics' share watermarks).

One instance per proxy, so that every feature writes the log with one protocol, one
memory of what was read and one set of locks (a virtual commit and a range commit of one
partition serialise like two range commits).
"""

from __future__ import annotations

from proxy.commits.cluster import ClusterClient
from proxy.commits.log import CommitLog
from proxy.commits.metrics import CommitLogMetrics
from proxy.commits.reads import CommittedReads
from proxy.commits.settings import CommitLogSettings
from proxy.commits.transactions import TransactionalCommits
from proxy.commits.writes import CommitWrites
from proxy.net.pool import BrokerPool
from proxy.pipeline import ClusterView
from proxy.pipeline.background import Background


class CommitService:
    def __init__(self, settings: CommitLogSettings, cluster: ClusterView, metrics: CommitLogMetrics | None = None,
                 *, pool: BrokerPool, background: Background | None = None) -> None:
        metrics = metrics or CommitLogMetrics()
        self.log = CommitLog(
            ClusterClient(pool, cluster),
            segment_bytes=settings.segment_bytes,
            on_rebuild=metrics.state_rebuilds.inc,
            on_write=metrics.write_seconds.observe,
        )
        self.reads = CommittedReads(self.log, cluster)
        self.writes = CommitWrites(self.log, metrics)
        # follow-ups of transactional commits run in ``background``: they outlive the connection
        self.transactions = TransactionalCommits(self.reads, self.writes,
                                                 background if background is not None else Background())
