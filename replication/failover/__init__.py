"""Failover: find the current namespace at run time (DNS CNAME -> SRV, a file, or fixed) and
switch clients when it changes. See ``runtime`` for the switching rules."""

from .base import FailoverError, Resolution, Resolver
from .config import HOST_MAP_SETTING, NAMESERVER_SETTING, FailoverSpec
from .runtime import (
    Failover,
    FailoverSwitched,
    NamespaceUnresolved,
    connection_for,
    parse_host_map,
    run_switching,
)

__all__ = [
    "HOST_MAP_SETTING",
    "NAMESERVER_SETTING",
    "Failover",
    "FailoverError",
    "FailoverSpec",
    "FailoverSwitched",
    "NamespaceUnresolved",
    "Resolution",
    "Resolver",
    "connection_for",
    "parse_host_map",
    "run_switching",
]
