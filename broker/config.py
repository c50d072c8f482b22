"""Broker configuration: TOML in, validated frozen dataclasses out.

Validation is strict on purpose: a misspelt key silently falling back to a
default is how brokers end up listening on the wrong port in production, so
every unknown key and every wrong type is an error that names the key.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

# "notice" (between info and warning, the default) is the broker's life: start, listeners,
# recovery, shutdown. "info" adds every connection and channel event.
LOG_LEVELS = ("debug", "info", "notice", "warning", "error", "critical")


class ConfigError(ValueError):
    """A configuration problem, with the offending key in the message."""


#: RabbitMQ's names for peer verification (its ssl_options.verify).
TLS_VERIFY = ("verify_none", "verify_peer")
#: What names the user of a SASL EXTERNAL login (RabbitMQ's ssl_cert_login_from).
CERT_LOGIN_FROM = ("common_name", "distinguished_name", "subject_alternative_name")
#: Subject alternative name types a login can come from (RabbitMQ's ssl_cert_login_san_type).
CERT_LOGIN_SAN_TYPES = ("dns", "ip", "email", "uri")


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """[management.tls]; also the common part of [amqp.tls]. Checked by broker/amqp/tls.py."""

    enabled: bool = False
    certfile: str = ""
    keyfile: str = ""
    cafile: str = ""
    verify: str = "verify_none"
    fail_if_no_peer_cert: bool = False


@dataclass(frozen=True, slots=True)
class AmqpTlsConfig(TlsConfig):
    port: int = 5671
    bind: tuple[str, ...] = ()  # empty: the addresses of [amqp] bind
    # Offer SASL EXTERNAL to clients with a verified certificate (RabbitMQ: the
    # rabbitmq_auth_mechanism_ssl plugin and EXTERNAL in auth_mechanisms).
    external_auth: bool = False
    cert_login_from: str = "common_name"
    cert_login_san_type: str = "dns"
    cert_login_san_index: int = 0


@dataclass(frozen=True, slots=True)
class AmqpConfig:
    bind: tuple[str, ...] = ("127.0.0.1", "::1")
    port: int = 5672
    backlog: int = 1024
    plain: bool = True  # false: TLS only (RabbitMQ's listeners.tcp = none)
    tls: AmqpTlsConfig = field(default_factory=AmqpTlsConfig)


@dataclass(frozen=True, slots=True)
class StreamTlsConfig(TlsConfig):
    port: int = 5551


#: [stream] port when unset: RabbitMQ's 5552 beside the default AMQP port; any free port
#: when [amqp] port is another (a second broker on one machine, every test broker).
STREAM_PORT = 5552


@dataclass(frozen=True, slots=True)
class StreamConfig:
    """RabbitMQ's stream protocol listener (broker/stream_protocol/)."""

    enabled: bool = True
    bind: tuple[str, ...] = ()  # empty: the addresses of [amqp] bind
    port: int | None = None  # None: STREAM_PORT when [amqp] port is 5672, else any free port
    advertised_host: str = ""  # what metadata tells clients; empty: the address they reached
    advertised_port: int = 0  # 0: the port they reached
    tls: StreamTlsConfig = field(default_factory=StreamTlsConfig)

    def listen_port(self, amqp_port: int) -> int:
        if self.port is not None:
            return self.port
        return STREAM_PORT if amqp_port == 5672 else 0


@dataclass(frozen=True, slots=True)
class ManagementConfig:
    enabled: bool = True
    bind: str = "127.0.0.1"
    port: int = 15672
    tls: TlsConfig = field(default_factory=TlsConfig)


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    max_message_size: int = 128 * 1024 * 1024
    frame_max: int = 131072
    channel_max: int = 2047
    heartbeat: int = 60
    max_connections: int = 0
    # A delivery unacknowledged this long closes its channel (406), as RabbitMQ's
    # consumer_timeout (default 30 minutes); 0 disables. Queues override: x-consumer-timeout.
    consumer_timeout_ms: int = 1_800_000


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    cache_keys: int = 10000


@dataclass(frozen=True, slots=True)
class StorageConfig:
    data_dir: str = "./data"
    sync_interval_ms: int = 5
    ack_sync_delay_ms: int = 10
    segment_size: int = 64 * 1024 * 1024
    queue_memory_limit: int = 64 * 1024 * 1024
    disk_free_limit: int = 50_000_000  # RabbitMQ's default: 50 MB


@dataclass(frozen=True, slots=True)
class MemoryConfig:
    # A fraction of RAM (0 < x <= 1; RabbitMQ's default 0.4) or bytes.
    high_watermark: int | float = 0.4


@dataclass(frozen=True, slots=True)
class ArchiveConfig:
    enabled: bool = False
    dir: str = "./data/archive"
    roll_minutes: float = 60
    max_body_bytes: int = 0
    batch_rows: int = 8192
    max_pending_batches: int = 16


@dataclass(frozen=True, slots=True)
class DiagnosticsConfig:
    loop_lag_probe_ms: int = 0  # 0: off; else a timer this often measures event-loop stalls
    # With the probe on: stalls this long or longer are kept, explained and logged
    stall_threshold_ms: float = 5.0


@dataclass(frozen=True, slots=True)
class LogConfig:
    level: str = "notice"
    format: str = "text"


@dataclass(frozen=True, slots=True)
class UserConfig:
    name: str
    password: str
    tags: tuple[str, ...] = ()
    loopback_only: bool = False


@dataclass(frozen=True, slots=True)
class VhostConfig:
    name: str


@dataclass(frozen=True, slots=True)
class PermissionConfig:
    user: str
    vhost: str
    configure: str = ".*"
    write: str = ".*"
    read: str = ".*"


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """[cluster] (docs/cluster.md). Absent: a single node, nothing of it runs."""

    etcd: tuple[str, ...] = ()  # etcd client URLs, tried in order
    node: str = ""  # this node's name, unique in the cluster
    replication_port: int = 25672  # peers connect here (RabbitMQ's inter-node port)
    advertise: str = ""  # the address peers use; empty: the first [amqp] bind address
    name: str = "roarmq"  # etcd key prefix: one etcd can hold several clusters
    replicas: int = 3  # copies of each vhost, the leader included
    #: Copies (the leader's included) that must be in sync when a confirm is released;
    #: fewer: publishes are nacked. None: a majority of the vhost's members (2 of 3), so
    #: no single lost disk or machine loses a confirmed message (`majority`).
    min_in_sync: int | None = None
    lease_ttl: int = 5  # seconds; a dead leader is replaced after about this long
    replica_lag_ms: int = 10_000  # a follower this far behind leaves the in-sync set
    #: A vhost's log is checkpointed (its live state rewritten at its head) and trimmed once
    #: it holds this many bytes and more than twice its live data (docs/cluster.md).
    checkpoint_bytes: int = 8 << 20
    #: Seconds a starting node waits for etcd to answer before it stops, saying so.
    join_timeout: int = 30


def majority(members: int) -> int:
    """The default `min_in_sync` of a vhost with that many members (RabbitMQ's quorum)."""
    return members // 2 + 1


def _default_users() -> tuple[UserConfig, ...]:
    return (UserConfig("guest", "guest", ("administrator",), True),)


def _default_vhosts() -> tuple[VhostConfig, ...]:
    return (VhostConfig("/"),)


def _default_permissions() -> tuple[PermissionConfig, ...]:
    return (PermissionConfig("guest", "/"),)


@dataclass(frozen=True, slots=True)
class Config:
    amqp: AmqpConfig = field(default_factory=AmqpConfig)
    management: ManagementConfig = field(default_factory=ManagementConfig)
    stream: StreamConfig = field(default_factory=StreamConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    storage: StorageConfig = field(default_factory=StorageConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    archive: ArchiveConfig = field(default_factory=ArchiveConfig)
    log: LogConfig = field(default_factory=LogConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    users: tuple[UserConfig, ...] = field(default_factory=_default_users)
    vhosts: tuple[VhostConfig, ...] = field(default_factory=_default_vhosts)
    permissions: tuple[PermissionConfig, ...] = field(default_factory=_default_permissions)
    cluster: ClusterConfig | None = None

    def with_overrides(
        self,
        *,
        port: int | None = None,
        mgmt_port: int | None = None,
        stream_port: int | None = None,
        data_dir: str | None = None,
        log_level: str | None = None,
        cluster_etcd: str | None = None,
        node: str | None = None,
        replication_port: int | None = None,
    ) -> Config:
        """Apply command-line overrides (which win over the file)."""
        cfg = self
        cluster = {
            k: v
            for k, v in (
                ("etcd", cluster_etcd and [u.strip() for u in cluster_etcd.split(",")]),
                ("node", node),
                ("replication_port", replication_port),
            )
            if v is not None
        }
        if cluster:  # merged into [cluster] and validated as a whole, errors naming the flag
            base = {}
            if cfg.cluster is not None:
                base = {  # what the file set (defaults stay defaults)
                    f.name: getattr(cfg.cluster, f.name)
                    for f in fields(ClusterConfig)
                    if getattr(cfg.cluster, f.name) != f.default
                }
                base["etcd"] = list(cfg.cluster.etcd)
            flags = {
                "etcd": "--cluster-etcd",
                "node": "--node",
                "replication_port": "--replication-port",
            }
            named = {k: flags[k] for k in cluster}
            cfg = replace(cfg, cluster=_cluster({**base, **cluster}, named))
        if port is not None:
            cfg = replace(cfg, amqp=replace(cfg.amqp, port=_port("--port", port)))
        if mgmt_port is not None:
            cfg = replace(
                cfg, management=replace(cfg.management, port=_port("--mgmt-port", mgmt_port))
            )
        if stream_port is not None:
            cfg = replace(cfg, stream=replace(cfg.stream, port=_port("--stream-port", stream_port)))
        if data_dir is not None:
            cfg = replace(cfg, storage=replace(cfg.storage, data_dir=data_dir))
        if log_level is not None:
            cfg = replace(cfg, log=replace(cfg.log, level=_log_level("--log-level", log_level)))
        return cfg

    def with_default_user(self, name: str, password: str) -> Config:
        """Add an administrator allowed from anywhere, with every permission on every vhost
        (RabbitMQ's image does this with RABBITMQ_DEFAULT_USER / RABBITMQ_DEFAULT_PASS; ours
        reads ROARMQ_DEFAULT_USER / ROARMQ_DEFAULT_PASS). A user of that name is replaced."""
        if not name or not password:
            raise ConfigError("ROARMQ_DEFAULT_USER and ROARMQ_DEFAULT_PASS must both be non-empty")
        users = tuple(u for u in self.users if u.name != name)
        users += (UserConfig(name, password, ("administrator",), False),)
        perms = tuple(p for p in self.permissions if p.user != name)
        perms += tuple(PermissionConfig(name, v.name) for v in self.vhosts)
        return replace(self, users=users, permissions=perms)


# -- validation helpers -------------------------------------------------------


def _port(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise ConfigError(
            f"{key}: must be a port number 0-65535 (0 = any free port), got {value!r}"
        )
    return value


def _log_level(key: str, value: Any) -> str:
    if not isinstance(value, str) or value.lower() not in LOG_LEVELS:
        raise ConfigError(f"{key}: must be one of {', '.join(LOG_LEVELS)}, got {value!r}")
    return value.lower()


def _int(key: str, value: Any, minimum: int = 0, maximum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}: must be an integer, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
        raise ConfigError(f"{key}: must be {bound}, got {value}")
    return value


def _number(key: str, value: Any, minimum: float, maximum: float) -> float:
    """A number (TOML integer or float) in (minimum, maximum]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or value != value:
        raise ConfigError(f"{key}: must be a number, got {value!r}")
    if not minimum < value <= maximum:
        raise ConfigError(f"{key}: must be more than {minimum} and at most {maximum}, got {value}")
    return value


_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


def _size(key: str, value: Any, minimum: int = 0) -> int:
    """Bytes: an integer, or a string with a unit as RabbitMQ writes them ("50MB", "1GiB")."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", value)
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise ConfigError(
                f'{key}: must be bytes or a size such as "50MB" or "1GiB", got {value!r}'
            )
        value = int(float(m.group(1)) * _UNITS[unit])
    return _int(key, value, minimum)


def _watermark(key: str, value: Any) -> int | float:
    """A fraction of RAM (a float, 0 < x <= 1) or bytes (an integer or a size string)."""
    if isinstance(value, float):
        return _number(key, value, 0.0, 1.0)
    return _size(key, value, 1024 * 1024)


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}: must be true or false, got {value!r}")
    return value


def _str(key: str, value: Any, *, nonempty: bool = True) -> str:
    if not isinstance(value, str) or (nonempty and not value):
        raise ConfigError(f"{key}: must be a non-empty string, got {value!r}")
    return value


def _address(key: str, value: Any) -> str:
    value = _str(key, value)
    if value != "localhost":
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ConfigError(f"{key}: {value!r} is not an IP address") from None
    return value


def _regex(key: str, value: Any) -> str:
    value = _str(key, value, nonempty=False)
    try:
        re.compile(value)
    except re.error as exc:
        raise ConfigError(f"{key}: invalid regular expression {value!r}: {exc}") from None
    return value


def _table(key: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{key}: must be a table, got {type(value).__name__}")
    return value


def _check_keys(section: str, data: dict[str, Any], allowed: type) -> None:
    known = {f.name for f in fields(allowed)}
    for key in data:
        if key not in known:
            raise ConfigError(
                f"{section}{key}: unknown setting (known: {', '.join(sorted(known))})"
            )


def _section(data: dict[str, Any], name: str, cls: type, checks: dict[str, Any]) -> Any:
    raw = _table(f"[{name}]", data.get(name, {}))
    _check_keys(f"[{name}] ", raw, cls)
    values = {k: checks[k](f"[{name}] {k}", v) for k, v in raw.items()}
    return cls(**values)


def _choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"{key}: must be one of {', '.join(choices)}, got {value!r}")
    return value


def _readable_file(key: str, path: str) -> None:
    try:
        with open(path, "rb"):
            pass
    except FileNotFoundError:
        raise ConfigError(f"{key}: {path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{key}: {path}: cannot read: {exc.strerror or exc}") from None


def _tls(name: str, value: Any, cls: type, checks: dict[str, Any]) -> Any:
    """[amqp.tls] or [management.tls]. Here: the keys, and that the files can be read when
    enabled; that they hold a matching key and certificates is broker/amqp/tls.py's check."""
    checks = {
        "enabled": _bool,
        "certfile": _str,
        "keyfile": _str,
        "cafile": _str,
        "verify": lambda k, v: _choice(k, v, TLS_VERIFY),
        "fail_if_no_peer_cert": _bool,
        **checks,
    }
    cfg = _section({name: value}, name, cls, checks)
    where = f"[{name}]"
    if cfg.fail_if_no_peer_cert and cfg.verify != "verify_peer":
        raise ConfigError(f'{where} fail_if_no_peer_cert: needs verify = "verify_peer"')
    if cfg.enabled:
        for key in ("certfile", "keyfile"):
            if not getattr(cfg, key):
                raise ConfigError(f"{where} {key}: missing (needed when enabled = true)")
        if cfg.verify == "verify_peer" and not cfg.cafile:
            raise ConfigError(
                f"{where} cafile: missing (verify_peer checks client certificates against it)"
            )
        for key in ("certfile", "keyfile", "cafile"):
            if getattr(cfg, key):
                _readable_file(f"{where} {key}", getattr(cfg, key))
    return cfg


def _check_listeners(amqp: AmqpConfig) -> None:
    tls = amqp.tls
    if not amqp.plain and not tls.enabled:
        raise ConfigError("[amqp] plain: false leaves no AMQP listener; enable [amqp.tls]")
    if tls.enabled and amqp.plain and tls.port == amqp.port != 0:
        if set(tls.bind or amqp.bind) & set(amqp.bind):
            raise ConfigError(f"[amqp.tls] port: {tls.port} is also the plain [amqp] port")
    if tls.external_auth and tls.verify != "verify_peer":
        # RabbitMQ refuses such logins ("TLS configuration is unsafe"); we refuse to start.
        raise ConfigError(
            '[amqp.tls] external_auth: needs verify = "verify_peer" (an unverified '
            "certificate would name any user)"
        )


_CLUSTER_NAME = re.compile(r"[A-Za-z0-9._-]+")


def _url(key: str, value: Any) -> str:
    value = _str(key, value)
    m = re.fullmatch(r"(https?)://([^/:]+|\[[0-9A-Fa-f:.]+\])(:(\d{1,5}))?/?", value)
    if m is None or (m.group(4) and int(m.group(4)) > 65535):
        raise ConfigError(
            f'{key}: must be an etcd client URL such as "http://10.0.0.1:2379", got {value!r}'
        )
    return value.rstrip("/")


def _cluster(raw: dict[str, Any], flags: dict[str, str] | None = None) -> ClusterConfig:
    """[cluster], also when built from --cluster-etcd/--node/--replication-port."""
    _check_keys("[cluster] ", raw, ClusterConfig)
    flags = flags or {}

    def urls(key: str, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value:
            raise ConfigError(f"{key}: must be a non-empty list of etcd client URLs")
        return tuple(_url(f"{key}[{i}]", v) for i, v in enumerate(value))

    def name(key: str, value: Any) -> str:
        if not isinstance(value, str) or not _CLUSTER_NAME.fullmatch(value):
            raise ConfigError(f"{key}: must be letters, digits, '.', '_' or '-', got {value!r}")
        return value

    checks = {
        "etcd": urls,
        "node": name,
        "replication_port": lambda k, v: _int(k, v, 1, 65535),
        "advertise": _address,
        "name": name,
        "replicas": lambda k, v: _int(k, v, 1, 9),
        "min_in_sync": lambda k, v: _int(k, v, 1, 9),
        "lease_ttl": lambda k, v: _int(k, v, 2, 600),  # etcd grants no lease under 2 s
        "replica_lag_ms": lambda k, v: _int(k, v, 1),
        "checkpoint_bytes": lambda k, v: _int(k, v, 1 << 16),
        "join_timeout": lambda k, v: _int(k, v, 1, 3600),
    }
    values = {k: checks[k](flags.get(k) or f"[cluster] {k}", v) for k, v in raw.items()}
    for required in ("etcd", "node"):
        if required not in values:
            flag = {"etcd": "--cluster-etcd", "node": "--node"}[required]
            raise ConfigError(f"[cluster] {required}: missing (or give {flag})")
    cfg = ClusterConfig(**values)  # type: ignore[arg-type]  # each value checked by its key's rule
    if cfg.min_in_sync is not None and cfg.min_in_sync > cfg.replicas:
        raise ConfigError(
            f"[cluster] min_in_sync: {cfg.min_in_sync} is more than replicas = {cfg.replicas}"
        )
    return cfg


def _array_of_tables(data: dict[str, Any], name: str) -> list[dict[str, Any]] | None:
    if name not in data:
        return None
    raw = data[name]
    if not isinstance(raw, list) or not all(isinstance(item, dict) for item in raw):
        raise ConfigError(f"[[{name}]]: must be an array of tables")
    return raw


def parse_config(data: dict[str, Any]) -> Config:
    """Validate a parsed TOML document and build a Config."""
    sections = {
        "amqp",
        "management",
        "stream",
        "limits",
        "routing",
        "storage",
        "memory",
        "archive",
        "log",
        "diagnostics",
        "users",
        "vhosts",
        "permissions",
        "cluster",
    }
    for key in data:
        if key not in sections:
            raise ConfigError(f"{key}: unknown section (known: {', '.join(sorted(sections))})")

    def bind_list(key: str, value: Any) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value:
            raise ConfigError(f"{key}: must be a non-empty list of addresses")
        return tuple(_address(f"{key}[{i}]", v) for i, v in enumerate(value))

    amqp_tls_checks = {
        "port": _port,
        "bind": bind_list,
        "external_auth": _bool,
        "cert_login_from": lambda k, v: _choice(k, v, CERT_LOGIN_FROM),
        "cert_login_san_type": lambda k, v: _choice(k, v, CERT_LOGIN_SAN_TYPES),
        "cert_login_san_index": lambda k, v: _int(k, v, 0),
    }
    amqp = _section(
        data,
        "amqp",
        AmqpConfig,
        {
            "bind": bind_list,
            "port": _port,
            "backlog": lambda k, v: _int(k, v, 1),
            "plain": _bool,
            "tls": lambda k, v: _tls("amqp.tls", v, AmqpTlsConfig, amqp_tls_checks),
        },
    )
    _check_listeners(amqp)
    management = _section(
        data,
        "management",
        ManagementConfig,
        {
            "enabled": _bool,
            "bind": _address,
            "port": _port,
            "tls": lambda k, v: _tls("management.tls", v, TlsConfig, {}),
        },
    )
    stream = _section(
        data,
        "stream",
        StreamConfig,
        {
            "enabled": _bool,
            "bind": bind_list,
            "port": _port,
            "advertised_host": _str,
            "advertised_port": _port,
            "tls": lambda k, v: _tls("stream.tls", v, StreamTlsConfig, {"port": _port}),
        },
    )
    limits = _section(
        data,
        "limits",
        LimitsConfig,
        {
            "max_message_size": lambda k, v: _int(k, v, 1, 512 * 1024 * 1024),
            "frame_max": lambda k, v: _int(k, v, 4096, 2**32 - 1),
            "channel_max": lambda k, v: _int(k, v, 0, 65535),
            "heartbeat": lambda k, v: _int(k, v, 0, 65535),
            "max_connections": lambda k, v: _int(k, v, 0),
            "consumer_timeout_ms": lambda k, v: _int(k, v, 0),
        },
    )
    routing = _section(data, "routing", RoutingConfig, {"cache_keys": lambda k, v: _int(k, v, 0)})
    storage = _section(
        data,
        "storage",
        StorageConfig,
        {
            "data_dir": _str,
            "sync_interval_ms": lambda k, v: _int(k, v, 0, 10000),
            "ack_sync_delay_ms": lambda k, v: _int(k, v, 0, 10000),
            "segment_size": lambda k, v: _int(k, v, 1024 * 1024),
            "queue_memory_limit": lambda k, v: _int(k, v, 0),
            "disk_free_limit": _size,
        },
    )
    memory = _section(data, "memory", MemoryConfig, {"high_watermark": _watermark})

    archive = _section(
        data,
        "archive",
        ArchiveConfig,
        {
            "enabled": _bool,
            "dir": _str,
            "roll_minutes": lambda k, v: _number(k, v, 0, 24 * 60),
            "max_body_bytes": lambda k, v: _int(k, v, 0, 128 * 1024 * 1024),
            "batch_rows": lambda k, v: _int(k, v, 1),
            "max_pending_batches": lambda k, v: _int(k, v, 1),
        },
    )

    def log_format(key: str, value: Any) -> str:
        if value not in ("text", "json"):
            raise ConfigError(f'{key}: must be "text" or "json", got {value!r}')
        return value

    log = _section(data, "log", LogConfig, {"level": _log_level, "format": log_format})
    diagnostics = _section(
        data,
        "diagnostics",
        DiagnosticsConfig,
        {
            "loop_lag_probe_ms": lambda k, v: _int(k, v, 0, 60_000),
            "stall_threshold_ms": lambda k, v: _number(k, v, 0, 60_000),
        },
    )

    users = _users(_array_of_tables(data, "users"))
    vhosts = _vhosts(_array_of_tables(data, "vhosts"))
    permissions = _permissions(_array_of_tables(data, "permissions"), users, vhosts)
    cluster = _cluster(_table("[cluster]", data["cluster"])) if "cluster" in data else None
    return Config(
        cluster=cluster,
        amqp=amqp,
        management=management,
        stream=stream,
        limits=limits,
        routing=routing,
        storage=storage,
        memory=memory,
        archive=archive,
        log=log,
        diagnostics=diagnostics,
        users=users,
        vhosts=vhosts,
        permissions=permissions,
    )


def _users(raw: list[dict[str, Any]] | None) -> tuple[UserConfig, ...]:
    if raw is None:
        return _default_users()
    users = []
    for i, item in enumerate(raw):
        where = f"[[users]] #{i + 1} "
        _check_keys(where, item, UserConfig)
        for required in ("name", "password"):
            if required not in item:
                raise ConfigError(f"{where}{required}: missing")
        tags = item.get("tags", [])
        if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
            raise ConfigError(f"{where}tags: must be a list of strings")
        users.append(
            UserConfig(
                name=_str(f"{where}name", item["name"]),
                password=_str(f"{where}password", item["password"], nonempty=False),
                tags=tuple(tags),
                loopback_only=_bool(f"{where}loopback_only", item.get("loopback_only", False)),
            )
        )
    names = [u.name for u in users]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError(f"[[users]] name: user {name!r} is defined twice")
    return tuple(users)


def _vhosts(raw: list[dict[str, Any]] | None) -> tuple[VhostConfig, ...]:
    if raw is None:
        return _default_vhosts()
    vhosts = []
    for i, item in enumerate(raw):
        where = f"[[vhosts]] #{i + 1} "
        _check_keys(where, item, VhostConfig)
        if "name" not in item:
            raise ConfigError(f"{where}name: missing")
        vhosts.append(VhostConfig(_str(f"{where}name", item["name"])))
    return tuple(vhosts)


def _permissions(
    raw: list[dict[str, Any]] | None,
    users: tuple[UserConfig, ...],
    vhosts: tuple[VhostConfig, ...],
) -> tuple[PermissionConfig, ...]:
    if raw is None:
        user_names = {u.name for u in users}
        vhost_names = {v.name for v in vhosts}
        return tuple(
            p for p in _default_permissions() if p.user in user_names and p.vhost in vhost_names
        )
    user_names = {u.name for u in users}
    vhost_names = {v.name for v in vhosts}
    perms = []
    for i, item in enumerate(raw):
        where = f"[[permissions]] #{i + 1} "
        _check_keys(where, item, PermissionConfig)
        for required in ("user", "vhost"):
            if required not in item:
                raise ConfigError(f"{where}{required}: missing")
        user = _str(f"{where}user", item["user"])
        vhost = _str(f"{where}vhost", item["vhost"])
        if user not in user_names:
            raise ConfigError(f"{where}user: no user named {user!r} in [[users]]")
        if vhost not in vhost_names:
            raise ConfigError(f"{where}vhost: no vhost named {vhost!r} in [[vhosts]]")
        perms.append(
            PermissionConfig(
                user=user,
                vhost=vhost,
                configure=_regex(f"{where}configure", item.get("configure", ".*")),
                write=_regex(f"{where}write", item.get("write", ".*")),
                read=_regex(f"{where}read", item.get("read", ".*")),
            )
        )
    return tuple(perms)


def load_config(path: str | Path) -> Config:
    """Read and validate a TOML config file; raises ConfigError naming the problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    try:
        return parse_config(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
