"""Client quotas (KIP-13, KIP-55, KIP-124, KIP-219, KIP-546, KIP-612).

``model``: Kafka's quota entities, keys, the checks of AlterClientQuotas and the filter of
DescribeClientQuotas, the eight levels of KIP-55's precedence (pure); ``store``: the durable
quota configs the supervisor owns and their published copy; ``messages``: AlterClientQuotas as
ring messages; ``rates``: the frontends' windowed rates and throttle decisions (sans-IO);
``supervisor``: the supervisor's service.
"""
