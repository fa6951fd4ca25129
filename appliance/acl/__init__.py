"""Kafka's ACL authorizer (``authorizer.class.name = StandardAuthorizer``), for one node.

- ``model``: Kafka's ACL vocabulary (resource types, pattern types, operations, permissions, with
  their wire codes and the names ``kafka-acls.sh`` prints), ``AclBinding`` and ``AclFilter``, the
  checks CreateAcls applies and the filter matching of DescribeAcls and DeleteAcls. Owns nothing.
- ``authorizer``: ``AclSnapshot`` (an immutable, indexed set of ACLs) and ``Authorizer``, the
  frontends' decision function with its cache (runs in every frontend process).
- ``messages``: the CreateAcls / DeleteAcls ring messages, frontend -> supervisor.
- ``store``: ``AclStore``, the durable ACLs (``<data_dir>/acls.json``), owned by the supervisor,
  which publishes a snapshot (``acls.msgpack`` in the runtime dir) and bumps ``acl_version`` on its
  state page; frontends map nothing per request but a version probe (``AclView``).
"""
