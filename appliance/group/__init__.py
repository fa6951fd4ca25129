"""The group coordinator (Kafka's GroupCoordinator and GroupMetadataManager), run by the
coordinator worker (``workers/coordinator.py``) through ``service.GroupService``.

Membership: ``membership.GroupCoordinator`` composes ``table.GroupTable`` (the shared state: the
groups of every type by id, the store, the timers, the deferred answers, the clock) and the
collaborators over it (``membership_join.RebalanceProtocol``, ``membership_sync.MemberRequests``,
``membership_admin.GroupAdmin``); ``classic_group`` is one classic group. Offsets:
``offsets.OffsetManager`` over the group log ``store.GroupStateStore``; ``records`` is their
contract. Consumer groups (KIP-848) and share groups (KIP-932) will plug in as group types of
their own in the same table, with their protocols as further collaborators (see
``membership``).
"""
