"""Bags: rosbag2 / MCAP reading and writing with rosbags (pure Python); the ``wamdiff-replay`` and
``wamdiff-record`` commands are ``bag_tools.py``.

The typestore is ROS 2 Kilted's plus this package's own messages (``wamdiff_ros/msg/*``) parsed from their .msg text;
their RIHS01 type hashes equal the ones rosidl generates, so bags written here play back in ``ros2 bag`` too.
Messages travel as raw CDR bytes throughout: replay publishes the bag's bytes unchanged, record stores the bytes
that arrive (``create_subscription(..., raw=True)``).

Nothing here imports rclpy: the typestore, :class:`McapFile` and :func:`read_messages` work without ROS 2 installed.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

from rosbags.interfaces import Connection, Qos, QosDurability, QosHistory, QosLiveliness, QosReliability, QosTime
from rosbags.rosbag2 import CompressionFormat, CompressionMode, Reader, StoragePlugin, Writer
from rosbags.typesys import Stores, get_types_from_msg, get_typestore
from rosbags.typesys.base import Nodetype

if TYPE_CHECKING:
    from rosbags.typesys.store import Typestore

PACKAGE = "wamdiff_ros"
REPO_MSG_DIR = Path(__file__).resolve().parents[2] / "msg"


# ---------------------------------------------------------------------------------------------------------------
# Typestore


def _share_dirs(package: str) -> list[Path]:
    """Candidate ``share/<package>`` folders: the ament index (AMENT_PREFIX_PATH), then this Python's prefix."""
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p]
    prefixes += [sys.prefix, os.environ.get("VIRTUAL_ENV", "")]
    seen, out = set(), []
    for prefix in prefixes:
        if not prefix:
            continue
        d = Path(prefix) / "share" / package
        if d not in seen and d.is_dir():
            seen.add(d)
            out.append(d)
    try:  # the ament index proper, when it is configured
        from ament_index_python.packages import PackageNotFoundError, get_package_share_directory

        try:
            d = Path(get_package_share_directory(package))
            if d not in seen and d.is_dir():
                out.insert(0, d)
        except (PackageNotFoundError, OSError, ValueError):
            pass
    except ImportError:
        pass
    return out


def msg_dir(package: str = PACKAGE) -> Path:
    """The folder holding ``package``'s .msg files: the repository's ``msg/`` for this package when present, else
    the installed ``share/<package>/msg``. Raises FileNotFoundError when neither exists."""
    if package == PACKAGE and any(REPO_MSG_DIR.glob("*.msg")):
        return REPO_MSG_DIR
    for share in _share_dirs(package):
        if any((share / "msg").glob("*.msg")):
            return share / "msg"
    raise FileNotFoundError(f"no .msg files of {package!r} found (repository msg/ or share/{package}/msg)")


def _nested_names(fielddefs: Any) -> Iterator[str]:
    """Type names referenced by a typestore field definition list."""
    for _, (nodetype, detail) in fielddefs[1]:
        while nodetype in (Nodetype.ARRAY, Nodetype.SEQUENCE):
            nodetype, detail = detail[0]
        if nodetype == Nodetype.NAME:
            yield detail


def ensure_type(store: Typestore, msgtype: str) -> bool:
    """Make ``msgtype`` (``pkg/msg/Name``) and everything it references known to ``store``, loading missing .msg
    files from installed ``share/<pkg>/msg`` folders. Returns False when some type cannot be found."""
    pending, done = [msgtype], set()
    while pending:
        name = pending.pop()
        if name in done:
            continue
        done.add(name)
        if name not in store.fielddefs:
            pkg, _, short = name.partition("/msg/")
            if not short:
                return False
            try:
                path = msg_dir(pkg) / f"{short}.msg"
            except FileNotFoundError:
                return False
            if not path.is_file():
                return False
            store.register(get_types_from_msg(path.read_text(), name))
        pending.extend(_nested_names(store.fielddefs[name]))
    return True


@functools.lru_cache(maxsize=1)
def _package_types() -> dict[str, Any]:
    types: dict[str, Any] = {}
    for path in sorted(msg_dir().glob("*.msg")):
        types.update(get_types_from_msg(path.read_text(), f"{PACKAGE}/msg/{path.stem}"))
    return types


def typestore() -> Typestore:
    """A fresh typestore: ROS 2 Kilted plus ``wamdiff_ros/msg/*`` (from the repository's or the installed .msg)."""
    store = get_typestore(Stores.ROS2_KILTED)
    store.register(_package_types())
    return store


# ---------------------------------------------------------------------------------------------------------------
# QoS in bags (rosbag2's offered_qos_profiles)

_ZERO = QosTime(0, 0)


def bag_qos(reliable: bool = True, transient_local: bool = False, depth: int = 10) -> Qos:
    """A rosbags QoS record for ``offered_qos_profiles``."""
    return Qos(QosHistory.KEEP_LAST, depth,
               QosReliability.RELIABLE if reliable else QosReliability.BEST_EFFORT,
               QosDurability.TRANSIENT_LOCAL if transient_local else QosDurability.VOLATILE,
               _ZERO, _ZERO, QosLiveliness.AUTOMATIC, _ZERO, False)


# ---------------------------------------------------------------------------------------------------------------
# One-file MCAP writer and reader


class McapFile:
    """Writes one self-contained ``.mcap`` file (rosbag2 metadata embedded) with rosbags' rosbag2 writer.

    rosbags writes a bag folder; this writes it next to ``path`` in a hidden temporary folder and moves the .mcap
    into place on :meth:`close` (an exception inside ``with`` removes it instead). Chunks are zstd-compressed unless
    ``compress=False`` (``ros2 bag`` and every MCAP reader handle both). Not thread-safe: one writer thread.
    """

    def __init__(self, path: str | Path, store: Typestore | None = None, *, compress: bool = True,
                 overwrite: bool = False) -> None:
        self.path = Path(path)
        if self.path.suffix != ".mcap":
            raise ValueError(f"{self.path}: the output must end in .mcap")
        if self.path.exists() and not overwrite:
            raise FileExistsError(f"{self.path} exists already")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.store = store if store is not None else typestore()
        self._tmp = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.", dir=self.path.parent))
        self._writer = Writer(self._tmp / "bag", version=Writer.VERSION_LATEST, storage_plugin=StoragePlugin.MCAP)
        if compress:
            self._writer.set_compression(CompressionMode.STORAGE, CompressionFormat.ZSTD)
        self._writer.open()
        self._connections: dict[tuple[str, str], Connection] = {}
        self.counts: Counter[str] = Counter()
        self.closed = False

    def connection(self, topic: str, msgtype: str, qos: Sequence[Qos] = ()) -> Connection:
        """The connection of (topic, msgtype), added on first use. Raises KeyError for a type the typestore (and
        the installed share/<pkg>/msg folders) do not know."""
        key = (topic, msgtype)
        conn = self._connections.get(key)
        if conn is None:
            if not ensure_type(self.store, msgtype):
                raise KeyError(f"message type {msgtype!r} is unknown (no .msg found for it)")
            conn = self._writer.add_connection(topic, msgtype, typestore=self.store, offered_qos_profiles=list(qos))
            self._connections[key] = conn
        return conn

    def write(self, topic: str, msgtype: str, stamp_ns: int, data: bytes | memoryview,
              qos: Sequence[Qos] = ()) -> None:
        """Append one serialized (CDR) message, logged at ``stamp_ns``."""
        self._writer.write(self.connection(topic, msgtype, qos), int(stamp_ns), data)
        self.counts[topic] += 1

    def close(self) -> Path:
        """Finish the file and move it into place; returns its path."""
        if not self.closed:
            self.closed = True
            self._writer.close()
            os.replace(self._tmp / "bag" / "bag.mcap", self.path)
            shutil.rmtree(self._tmp, ignore_errors=True)
        return self.path

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self._writer.abort()
            finally:
                shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> McapFile:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def read_messages(path: str | Path, topics: Sequence[str] = ()) -> Iterator[tuple[Connection, int, bytes]]:
    """(connection, log time ns, raw CDR) of a bag (an .mcap/.db3 file or a rosbag2 folder), in time order."""
    with Reader(path) as reader:
        conns = [c for c in reader.connections if not topics or c.topic in topics]
        if conns:
            yield from reader.messages(connections=conns)


def mcap_metadata(path: str | Path) -> dict[str, Any]:
    """The rosbag2 metadata (``rosbag2_bagfile_information``) embedded in an .mcap file written by rosbag2 or
    rosbags, as a dict; {} when there is none. It holds what rosbags' reader leaves out, e.g. the topics'
    ``type_description_hash``."""
    import struct

    from ruamel.yaml import YAML

    with open(path, "rb") as f:
        if f.read(8) != b"\x89MCAP0\r\n":
            raise ValueError(f"{path} is not an MCAP file")
        while head := f.read(9):
            if len(head) < 9:
                break
            op, length = head[0], struct.unpack("<Q", head[1:])[0]
            if op != 0x0C:  # not a metadata record: skip it
                f.seek(length, os.SEEK_CUR)
                continue
            body = f.read(length)
            n = struct.unpack_from("<I", body)[0]
            name, pos = body[4:4 + n].decode(), 4 + n
            if name != "rosbag2":
                continue
            end, pos = pos + 4 + struct.unpack_from("<I", body, pos)[0], pos + 4
            while pos < end:
                k = struct.unpack_from("<I", body, pos)[0]
                key, pos = body[pos + 4:pos + 4 + k].decode(), pos + 4 + k
                v = struct.unpack_from("<I", body, pos)[0]
                value, pos = body[pos + 4:pos + 4 + v].decode(), pos + 4 + v
                if key == "serialized_metadata":
                    return dict(YAML(typ="safe").load(value) or {})
    return {}


def type_hashes(path: str | Path) -> dict[str, str]:
    """{topic: RIHS01 type hash} from an .mcap file's embedded rosbag2 metadata."""
    topics = mcap_metadata(path).get("topics_with_message_count") or []
    return {t["topic_metadata"]["name"]: t["topic_metadata"].get("type_description_hash", "") for t in topics}


def topic_counts(path: str | Path) -> dict[str, tuple[str, int]]:
    """{topic: (msgtype, message count)} of a bag."""
    with Reader(path) as reader:
        return {t: (info.msgtype or "", info.msgcount) for t, info in reader.topics.items()}
