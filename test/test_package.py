"""Package layout: ROS manifest, entry points, parameter file and interface definitions agree with the code."""

import xml.etree.ElementTree as ET
from pathlib import Path


from wamdiff_ros.format import Command

ROOT = Path(__file__).resolve().parents[1]


def test_package_xml_is_format_3():
    root = ET.parse(ROOT / "package.xml").getroot()
    assert root.tag == "package" and root.get("format") == "3"
    assert root.findtext("name") == "wamdiff_ros"
    # One hybrid ament_cmake package: CMakeLists.txt generates msg/ with rosidl and installs the Python package.
    assert root.findtext("export/build_type") == "ament_cmake"
    assert root.findtext("member_of_group") == "rosidl_interface_packages"


def test_design_card_top_level():
    for name in ["package.xml", "CMakeLists.txt", "setup.py", "wamdiff_ros", "launch", "config", "msg", "training",
                 "test", "README.md", ".ci/run", "Makefile", "requirements.lock"]:
        assert (ROOT / name).exists(), name


def test_lock_pins_exact_versions_and_cpu_torch():
    pins = [l for l in (ROOT / "requirements.lock").read_text().splitlines() if l and not l.startswith("#")]
    assert pins and all("==" in p for p in pins)
    assert "torch==2.13.0" in pins and not any(p.startswith("torchvision") for p in pins)


def test_driving_command_constants_cover_the_commands():
    text = (ROOT / "msg" / "DrivingCommand.msg").read_text()
    for name in ("LANE_FOLLOW", "LEFT", "RIGHT", "STRAIGHT"):
        assert f"uint8 {name}=" in text
    assert len(Command) == 4
