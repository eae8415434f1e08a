"""What every node process of the package shares: parameters declared from a table, a diagnostics message, and the
``main`` that spins nodes until Ctrl-C or shutdown and tears them down."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence

import rclpy
from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus, KeyValue
from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.exceptions import ParameterException
from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor
from rclpy.node import Node

from wamdiff_ros.errors import WamDiffError
from wamdiff_ros.ros.parameters import Param


def table_params(table: Mapping[str, tuple[object, str]], read_only: bool = True) -> tuple[Param, ...]:
    """A bridge node's ``{name: (default, description)}`` table as ``Param`` rows."""
    return tuple(Param(name, default, text, read_only=read_only) for name, (default, text) in table.items())


def declare_parameters(node: Node, params: Iterable[Param]) -> None:
    """Declare each parameter with its description, range and read-only flag."""
    for param in params:
        default = list(param.default) if isinstance(param.default, tuple) else param.default
        node.declare_parameter(param.name, default, _descriptor(param))


def _descriptor(param: Param) -> ParameterDescriptor:
    d = ParameterDescriptor(description=param.description, read_only=param.read_only)
    if param.low is not None and isinstance(param.default, int):
        d.integer_range = [IntegerRange(from_value=int(param.low), to_value=int(param.high), step=1)]
    elif param.low is not None:
        d.floating_point_range = [FloatingPointRange(from_value=float(param.low), to_value=float(param.high),
                                                     step=0.0)]
    return d


def diagnostics_msg(node_name: str, what: str, level: bytes, message: str, values: Mapping[str, object],
                    stamp) -> DiagnosticArray:
    """One status named ``<node_name>: <what>`` with ``values`` as strings, stamped ``stamp``."""
    status = DiagnosticStatus(level=level, name=f"{node_name}: {what}", message=message, hardware_id=node_name,
                              values=[KeyValue(key=k, value=str(v)) for k, v in values.items()])
    msg = DiagnosticArray(status=[status])
    msg.header.stamp = stamp
    return msg


def spin_nodes(name: str, build: Callable[[], Sequence[Node]], argv: list[str] | None = None, *,
               running: Callable[[Sequence[Node]], bool] | None = None,
               finish: Callable[[Sequence[Node]], None] | None = None) -> int:
    """A node process's ``main``: ``build()`` the nodes (a bad parameter value is said on stderr, exit code 2), spin
    them on one single-threaded executor until Ctrl-C, shutdown or, when given, ``running(nodes)`` turns False; then
    ``finish(nodes)`` and the nodes are destroyed."""
    rclpy.init(args=list(sys.argv if argv is None else argv))
    try:
        nodes = build()
    except (WamDiffError, ValueError, ParameterException) as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        rclpy.try_shutdown()
        return 2
    executor = SingleThreadedExecutor()  # callbacks are short; inference has its own thread
    for node in nodes:
        executor.add_node(node)
    try:
        if running is None:
            executor.spin()
        else:
            while rclpy.ok() and running(nodes):
                executor.spin_once(timeout_sec=0.1)
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    finally:
        if finish is not None:
            finish(nodes)
        for node in nodes:
            node.destroy_node()
        rclpy.try_shutdown()
    return 0
