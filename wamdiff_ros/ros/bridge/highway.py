"""``wamdiff_highway_bridge``: the CPU closed-loop world (highway-env) as a ROS 2 simulator and clock master.

The same contract as Bench2Drive's ROS 2 mode (carla-ros-bridge in passive synchronous mode): the world advances
only when the bridge ticks. Each tick it applies the newest plan through the ``WaypointFollower`` and the highway-env
actuator, steps the world by 1 / sim_hz, and publishes ``/clock`` and the ego's odometry; every
sim_hz / camera_hz ticks it also publishes the navigation command, the route (nav_msgs/Path in the odometry frame,
the route lane's centre 0-60 m ahead), camera_info and the rendered front camera. With
``sync`` the world then waits for the plan of that frame (up to ``sync_timeout_s`` wall seconds), so results do not
depend on CPU speed; without it the world runs free, paced by ``real_time_factor``.

Plans (PlannerOutput) hold waypoints in base_link at the image's stamp; their origin is the ego pose of that stamp
from a short pose history. An episode ends as the world says (completed, route deviation, blocked, timeout) or at
``max_sim_s``; the bridge then logs the Bench2Drive score, writes the results JSON and resets to the next seed, or
stops. The clock never goes back: a new episode continues the clock.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

from diagnostic_msgs.msg import DiagnosticArray, DiagnosticStatus
from nav_msgs.msg import Odometry
from nav_msgs.msg import Path as PathMsg
from rclpy.clock import Clock, ClockType
from rclpy.node import Node
from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy
from rosgraph_msgs.msg import Clock as ClockMsg
from sensor_msgs.msg import CameraInfo, Image

from wamdiff_ros.control import FollowerGains, HighwayEnvActuator, WaypointFollower
from wamdiff_ros.errors import WamDiffError
from wamdiff_ros.geometry import Pose2D
from wamdiff_ros.msg import DrivingCommand, PlannerOutput
from wamdiff_ros.ros.bridge import messages as bm
from wamdiff_ros.ros.bridge.episode import Episode
from wamdiff_ros.ros.bridge.sync import PlanTracker, PoseHistory, TickGate
from wamdiff_ros.ros.conversions import path_msg, rgb_to_image, stamp_ns, time_ns
from wamdiff_ros.route_points import ROUTE_PATH_M
from wamdiff_ros.world.camera import CameraConfig, FrontCamera
from wamdiff_ros.world.perturb import Perturber, label, parse_perturbations
from wamdiff_ros.world.scenarios import load_scenarios
from wamdiff_ros.world.sim import World
from wamdiff_ros.geometry import wrap_angle
from wamdiff_ros.ros.common import declare_parameters, diagnostics_msg, spin_nodes, table_params

NODE_NAME = "wamdiff_highway_bridge"
# Sensor topics as a simulator names them (planner.launch.py's defaults); relative, so a namespace moves them all.
TOPICS = {"image": "camera/front/image_raw", "camera_info": "camera/front/camera_info", "odometry": "odom",
          "command": "route/command", "route": "route/path", "plan": "wamdiff_planner/output/plan"}
CLOCK_START_NS = 1_000_000_000  # many ROS tools read a zero stamp as "unset"
REPUBLISH_WALL_S = 1.0  # while the planner is not up yet, the first frame is sent again this often
ADVANCE_BUDGET_WALL_S = 0.02  # the stepping loop yields to the executor after this much work


PARAMETERS = {  # name: (default, description); all read at start
    "scenario": ("highway", "scenario name (highway | merge | roundabout | intersection)"),
    "scenario_file": ("", "scenario YAML, or v1 / v2 for a frozen set shipped with the package ('' = v1)"),
    "seed": (1_000_000, "seed of the first episode, +1 per reset (1000000: the held-out split, as wamdiff-eval)"),
    "episodes": (1, "episodes to run, then stop; 0 = reset to the next seed forever"),
    "max_sim_s": (0.0, "stop after this much sim time over all episodes (0 = no limit); the running episode is "
                       "scored as it stands"),
    "sync": (True, "after each camera frame wait for its plan (synchronous mode)"),
    "sync_timeout_s": (2.0, "sync mode: wall seconds to wait for a frame's plan before stepping on"),
    "real_time_factor": (0.0, "sim seconds per wall second at most (0 = as fast as allowed)"),
    "camera_hz": (10.0, "camera / command rate; a divisor of the world's sim_hz (20)"),
    "camera_width": (256, "front camera width, pixels"),
    "camera_height": (128, "front camera height, pixels"),
    "camera_fov_deg": (90.0, "front camera horizontal field of view, degrees"),
    "startup_timeout_s": (120.0, "wall seconds to wait for the planner's first plan before the world starts anyway "
                                 "(0 = start at once)"),
    "odom_frame": ("odom", "frame of the odometry pose (the world frame)"),
    "base_frame": ("base_link", "the ego frame (odometry child frame, the twist's frame)"),
    "camera_frame": ("camera_front", "frame_id of the image and camera_info"),
    "planner_name": ("wamdiff_planner", "planner name written into the episode scores"),
    "results_json": ("", "write the episode scores and totals here after each episode ('' = nowhere)"),
    "exit_when_done": (False, "shut the process down once the last episode is scored"),
    "pose_history_s": (10.0, "seconds of ego poses kept to find a plan's origin"),
    "diagnostics_period_s": (1.0, "diagnostics period, wall seconds"),
    "perturb": ("", "deployment perturbations after Bench2Drive-Robust on what the agent reads (image, odometry) and "
                    "actuates: NAME[=SEVERITY],... of frame_drop, occlusion, gnss, speed, latency ('' = none; "
                    "wamdiff_ros/world/perturb.py), seeded by the episode"),
    "compensate_delay": (False, "the bridge's follower compensates the latency perturbation's actuation delay"),
}


class HighwayBridge(Node):
    def __init__(self, **kwargs) -> None:
        super().__init__(NODE_NAME, **kwargs)
        declare_parameters(self, table_params(PARAMETERS))
        v = self._param
        self.scenarios = load_scenarios(v("scenario_file") or None)
        self.spec = self.scenarios.get(v("scenario"))
        self.dt_ns = round(1e9 / self.scenarios.sim_hz)
        if not v("camera_hz") > 0:
            raise ValueError(f"camera_hz must be > 0, got {v('camera_hz')}")
        self.frame_every = max(1, round(self.scenarios.sim_hz / v("camera_hz")))
        self.camera_config = CameraConfig(width=v("camera_width"), height=v("camera_height"),
                                          fov_deg=v("camera_fov_deg"))
        self.perturbations = parse_perturbations(v("perturb"))
        gains = FollowerGains.for_world("highway_env")
        if v("compensate_delay"):
            gains = dataclasses.replace(gains, actuation_delay_s=Perturber(self.perturbations, 0, self.scenarios.sim_hz)
                                        .delay_ticks / self.scenarios.sim_hz)
        self.follower, self.actuator = WaypointFollower(gains), HighwayEnvActuator(gains)
        self.history = PoseHistory(v("pose_history_s"))
        self.tracker = PlanTracker(self.history)
        rtf = v("real_time_factor")
        self.gate = TickGate(v("sync"), v("sync_timeout_s"), self.dt_ns * 1e-9 / rtf if rtf > 0 else 0.0)
        self.mode = "paused" if v("sync") else "realtime"

        reliable = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)
        latched = QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE,
                             durability=DurabilityPolicy.TRANSIENT_LOCAL)
        self._clock_pub = self.create_publisher(ClockMsg, "/clock", reliable)
        self._image_pub = self.create_publisher(Image, TOPICS["image"], reliable)  # matches best-effort readers too
        self._info_pub = self.create_publisher(CameraInfo, TOPICS["camera_info"], reliable)
        self._odom_pub = self.create_publisher(Odometry, TOPICS["odometry"], 20)
        self._command_pub = self.create_publisher(DrivingCommand, TOPICS["command"], latched)
        self._route_pub = self.create_publisher(PathMsg, TOPICS["route"], latched)
        self._diag_pub = self.create_publisher(DiagnosticArray, "/diagnostics", 10)
        self.create_subscription(PlannerOutput, TOPICS["plan"], self._on_plan, 10)

        self.seed = v("seed")
        self.clock_ns = CLOCK_START_NS
        self.results: list[dict] = []
        self.total_ticks = self.total_frames = 0
        self.bad_plans = 0
        self.started = v("startup_timeout_s") == 0
        self.finished = self.exit_requested = False
        self.wall_start = time.monotonic()  # then the start of the world (_start)
        self._last_republish = -math.inf
        self._frame_wall: dict[int, float] = {}  # frame stamp -> wall time it was sent (plan latency)
        self._prev_heading: float | None = None
        self._new_episode(CLOCK_START_NS)
        steady = Clock(clock_type=ClockType.STEADY_TIME)  # the bridge makes sim time: it must not wait on it
        period = self.gate.period_s
        self.create_timer(min(0.01, period) if period > 0 else 0.01, self._on_timer, clock=steady)
        self.create_timer(v("diagnostics_period_s"), self._publish_diagnostics, clock=steady)
        self.get_logger().info(
            f"{self.spec.name} seed {self.seed}: {self.scenarios.sim_hz} Hz world, camera every {self.frame_every} "
            f"ticks, {'sync' if v('sync') else 'free-running'}; waiting for plans on "
            f"{self.resolve_topic_name(TOPICS['plan'])}")

    def _param(self, name: str):
        return self.get_parameter(name).value

    # -- episodes -------------------------------------------------------------------------------------------------
    def _new_episode(self, start_ns: int) -> None:
        world = World(self.spec, self.seed, self.scenarios)
        self.follower.reset()
        self.tracker.reset()
        self.history.clear()
        self.gate.release()
        self._prev_heading = None
        self.episode = Episode(world, FrontCamera(world.geometry, self.camera_config), start_ns)
        # what the agent reads and actuates: the world's own unless a perturbation is on
        self.perturber = Perturber(self.perturbations, self.seed, self.scenarios.sim_hz)
        self._reading: tuple[Pose2D, float] | None = None  # the pose and speed last published (odometry)
        self._publish_state(time.monotonic())

    def _sim_total_s(self) -> float:
        return self.total_ticks * self.dt_ns * 1e-9

    def _end_episode(self) -> None:
        ep = self.episode
        score, record = ep.result(self._param("planner_name"), self.mode)
        if self.perturber.active:
            record["perturbation"] = {"label": label(self.perturbations), **self.perturber.stats}
        self.results.append(record)
        self.get_logger().info(
            f"episode {len(self.results)} ({self.spec.name}, seed {self.seed}) {score.end_reason} after "
            f"{ep.world.t:.1f} s: DS {score.driving_score:.1f}, RC {score.route_completion:.1f} %, penalty "
            f"{score.infraction_penalty:.2f}, {score.collisions} collisions, {ep.distance_m:.0f} m driven, "
            f"{ep.plans_applied} plans applied")
        self._write_results()
        episodes = self._param("episodes")
        max_sim = self._param("max_sim_s")
        if (episodes and len(self.results) >= episodes) or (max_sim and self._sim_total_s() >= max_sim - 1e-9):
            self.finished = True
            self.get_logger().info(f"done: {len(self.results)} episodes, {self._sim_total_s():.1f} s simulated")
            self.exit_requested = bool(self._param("exit_when_done"))
            self._publish_diagnostics()  # the final state
            return
        self.seed += 1
        self._new_episode(self.clock_ns + self.dt_ns)

    def totals(self) -> dict:
        c = self.tracker.counters
        return {"episodes": len(self.results), "sim_s": round(self._sim_total_s(), 3),
                "wall_s": round(time.monotonic() - self.wall_start, 3), "ticks": self.total_ticks,
                "frames": self.total_frames,
                "plans_received": c.received, "plans_applied": c.applied, "plans_dropped": dict(c.dropped),
                "bad_plans": self.bad_plans, "sync_timeouts": self.gate.timeouts,
                "distance_m": round(sum(r["distance_m"] for r in self.results), 2),
                "progress_m": round(sum(r["progress_m"] for r in self.results), 2),
                "clock_s": round((self.clock_ns - CLOCK_START_NS) * 1e-9, 3)}

    def _write_results(self) -> None:
        path = self._param("results_json")
        if not path:
            return
        out = {"scenario": self.spec.name, "first_seed": self._param("seed"), "mode": self.mode,
               "sync": self._param("sync"), "camera_hz": self.scenarios.sim_hz / self.frame_every,
               "sim_hz": self.scenarios.sim_hz, "perturb": label(self.perturbations),
               "compensate_delay": bool(self._param("compensate_delay")), "episodes": self.results,
               "totals": self.totals()}
        try:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(json.dumps(out, indent=1))
        except OSError as exc:  # a bad path must not stop the world
            self.get_logger().error(f"results not written to {path}: {exc}", throttle_duration_sec=10.0)

    # -- stepping ---------------------------------------------------------------------------------------------------
    def _on_timer(self) -> None:
        wall = time.monotonic()
        if not self.started:
            if wall - self.wall_start >= self._param("startup_timeout_s"):
                self._start(wall)
                self.gate.release()
                self.get_logger().warning("no plan from the planner yet: the world starts anyway")
            elif wall - self._last_republish >= REPUBLISH_WALL_S:
                self._publish_state(wall, republish=True)  # the planner may not have been listening yet
                return
        self._advance(wall)

    def _start(self, wall: float) -> None:
        self.started = True
        self.wall_start = self.episode.wall_start = wall  # wall_s and the real-time factor count from here

    def _advance(self, wall: float) -> None:
        end = wall + ADVANCE_BUDGET_WALL_S
        while self.started and not self.finished:
            timeouts = self.gate.timeouts
            if not self.gate.ready(wall):
                return
            if self.gate.timeouts > timeouts:
                self.get_logger().warning(f"no plan within {self.gate.timeout_s:.1f} s for the frame: stepping on "
                                          f"({self.gate.timeouts} timeouts)", throttle_duration_sec=5.0)
            self._tick(wall)
            wall = time.monotonic()
            if wall > end:
                return

    def _tick(self, wall: float) -> None:
        ep, world = self.episode, self.episode.world
        pose, speed = self._reading if self._reading is not None else (world.ego_pose, world.ego_speed)
        control = self.follower.step(self.tracker.active, pose, speed, self.clock_ns * 1e-9)
        before = world.ego_pose
        self.perturber.before_tick(lambda: ep.camera.render(world.ego_pose, world.others()))
        world.step(*self.perturber.actuate(self.actuator(control)))
        self.perturber.after_tick()
        ep.moved(before)
        ep.ticks += 1
        self.total_ticks += 1
        self.gate.ticked(wall)
        max_sim = self._param("max_sim_s")
        over = world.done or (max_sim and self._sim_total_s() >= max_sim - 1e-9)
        self._publish_state(wall, camera=not over)
        if over:
            self._end_episode()

    def _publish_state(self, wall: float, republish: bool = False, camera: bool = True) -> None:
        """Clock and odometry every tick; command, camera_info and image on camera ticks (the planner pairs an image
        with the odometry of its stamp, whichever arrives first); no frame once the episode is over."""
        ep, world = self.episode, self.episode.world
        self.clock_ns = ns = ep.start_ns + ep.ticks * self.dt_ns
        stamp = ns * 1e-9
        truth = world.ego_pose
        yaw_rate = 0.0 if self._prev_heading is None or republish else \
            wrap_angle(truth.heading - self._prev_heading) / world.dt
        self._prev_heading = truth.heading
        if republish and self._reading is not None:
            pose, speed = self._reading
        else:  # this tick's reading: perturbed when a perturbation is on
            pose, factor = self.perturber.pose(truth), self.perturber.speed_factor()
            speed = world.ego_speed * factor
            self._reading = (pose, speed)
        velocity = tuple(v * speed / world.ego_speed for v in world.ego_velocity()) if world.ego_speed > 1e-6 else \
            world.ego_velocity()
        if not republish:
            self.history.add(stamp, pose)  # plans are anchored where the agent believed it was
        self._clock_pub.publish(bm.clock_msg(ns))
        frame = self._param("base_frame")
        self._odom_pub.publish(bm.odometry_msg(ns, pose, velocity, yaw_rate, self._param("odom_frame"), frame))
        if ep.ticks % self.frame_every or not camera:
            return
        self._command_pub.publish(bm.command_msg(world.command, ns))
        self._route_pub.publish(path_msg(world.route_centre(ROUTE_PATH_M), time_ns(ns), self._param("odom_frame")))
        self._info_pub.publish(bm.camera_info_msg(self.camera_config, ns, self._param("camera_frame")))
        image = self.perturber.camera(lambda: ep.camera.render(truth, world.others())).image
        self._image_pub.publish(rgb_to_image(image, time_ns(ns), self._param("camera_frame")))
        if republish:
            self._last_republish = wall
        else:
            ep.frames += 1
            self.total_frames += 1
        self._frame_wall[ns] = wall
        while len(self._frame_wall) > 64:
            self._frame_wall.pop(next(iter(self._frame_wall)))
        self.gate.frame_sent(stamp, wall)

    # -- plans ------------------------------------------------------------------------------------------------------
    def _on_plan(self, msg: PlannerOutput) -> None:
        wall = time.monotonic()
        try:
            plan = bm.plan_from_msg(msg)
        except WamDiffError as exc:
            self.bad_plans += 1
            self.get_logger().warning(f"dropped a malformed plan: {exc}", throttle_duration_sec=2.0)
            return
        ns = stamp_ns(msg.header.stamp)
        sent = self._frame_wall.pop(ns, None)
        ep = self.episode
        if sent is not None and not self.finished:
            ep.latencies.append(wall - sent)
        reason = self.tracker.offer(plan)
        if reason is not None:
            self.get_logger().warning(f"plan stamped {plan.stamp:.3f} dropped: {reason}", throttle_duration_sec=5.0)
        else:
            ep.plans_applied += 1
            ep.forward_calls += plan.forward_calls
            ep.new_tokens += plan.new_tokens
        if not self.started:
            self._start(wall)
            self.get_logger().info("the planner answers: the world starts")
        if self.gate.plan_arrived(plan.stamp) or not self.gate.sync:
            self._advance(wall)

    # -- diagnostics ----------------------------------------------------------------------------------------------
    def _publish_diagnostics(self) -> None:
        world, c = self.episode.world, self.tracker.counters
        state = "finished" if self.finished else "running" if self.started else "waiting for the planner"
        level = DiagnosticStatus.OK if self.started else DiagnosticStatus.WARN
        if self.gate.timeouts or self.bad_plans:
            level = DiagnosticStatus.WARN
        values = {
            "state": state, "scenario": self.spec.name, "seed": self.seed, "episode": len(self.results) + 1,
            "sim_time_s": round(self._sim_total_s(), 3), "episode_t_s": round(world.t, 3), "ticks": self.total_ticks,
            "waiting_for_plan": self.gate.awaiting is not None, "sync_timeouts": self.gate.timeouts,
            "plans_received": c.received, "plans_applied": c.applied, "bad_plans": self.bad_plans,
            **{f"dropped.{k}": n for k, n in c.dropped.items()},
            "speed_mps": round(world.ego_speed, 2), "progress_m": round(world.progress_m - world.route.start_m, 1),
            "route_length_m": round(world.route_length_m, 1), "on_route": world.on_route,
            "real_time_factor": round(self._sim_total_s() / max(time.monotonic() - self.wall_start, 1e-9), 3),
        }
        if self.results:
            values["last_driving_score"] = round(self.results[-1]["driving_score"], 2)
            values["last_end_reason"] = self.results[-1]["end_reason"]
        message = f"{state}; {self.gate.timeouts} sync timeouts"
        self._diag_pub.publish(diagnostics_msg(NODE_NAME, "world", level, message, values, time_ns(self.clock_ns)))


def main(argv: list[str] | None = None) -> int:
    return spin_nodes(NODE_NAME, lambda: [HighwayBridge()], argv, running=lambda nodes: not nodes[0].exit_requested,
                      finish=lambda nodes: nodes[0]._write_results())


if __name__ == "__main__":
    raise SystemExit(main())
