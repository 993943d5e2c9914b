"""Values and checks that the engine, the wire codec (``protocol``) and the clients all
use, below all three: ``messages`` (Message, QueueStats, bodies), ``records`` (Record,
RecordMetadata, TopicPartition), ``headers`` (their encoding, the reply headers),
``checks`` (limits and argument checks), ``keepalive`` and ``processing`` (a delivery's
lease renewed, its settling by a block), ``composite`` (a member of a group on several
streams). It imports nothing of shmq but ``shmq.errors`` (tests/test_layers.py), so a
TCP client loads no shared-memory code."""
