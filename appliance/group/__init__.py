"""The group coordinator (Kafka's GroupCoordinator and GroupMetadataManager), run by the
coordinator worker (``workers/coordinator.py``) through ``service.GroupService``.

Membership: ``membership.GroupCoordinator`` composes ``table.GroupTable`` (the shared state: the
groups of every type by id, the store, the timers, the deferred answers, the clock) and the
collaborators over it (``membership_join.RebalanceProtocol``, ``membership_sync.MemberRequests``,
``membership_admin.GroupAdmin``); ``classic_group`` is one classic group. Offsets:
``offsets.OffsetManager`` over the group log ``store.GroupStateStore``; ``records`` is their
contract. KIP-848 consumer groups are a group type of their own in the same table
(``consumer_group``), with their protocol as a further collaborator
(``consumer_protocol.ConsumerGroupProtocol``), the server-side assignors (``assignors``) and
their records in the group log (``consumer_records``); share groups (KIP-932) would plug in the
same way (see ``membership``).
"""
