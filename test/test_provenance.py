"""Where a measurement ran: recorded beside every timed result (closed-loop reports, the decode benchmark)."""

import subprocess

from wamdiff_ros import provenance


def test_host_info_names_the_machine_and_the_code():
    host = provenance.host_info()
    assert set(host) == {"cpu", "cores", "torch", "package", "commit"}
    assert host["cpu"] and host["cores"] >= 1 and host["torch"].startswith("2.")
    inside = subprocess.run(["git", "-C", str(provenance.PACKAGE_DIR), "rev-parse", "HEAD"], capture_output=True,
                            text=True)
    if inside.returncode == 0:  # a checkout (CI clones one): its commit, marked when tracked files differ
        assert host["commit"].split("-")[0] == inside.stdout.strip()[:12]
    else:
        assert host["commit"] is None


def test_no_commit_outside_a_checkout(tmp_path):
    assert provenance.git_commit(tmp_path) is None


def test_same_host_compares_machine_and_code():
    a = {"cpu": "X", "cores": 2, "torch": "2.13.0", "commit": "abc", "package": "0.1"}
    assert provenance.same_host(a, dict(a)) is True
    assert provenance.same_host(a, {**a, "commit": "def"}) is False
    assert provenance.same_host(a, {**a, "cores": 16}) is False
    assert provenance.same_host(a, None) is None and provenance.same_host({}, a) is None


def _commit_all(repo, message):
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", message],
                   check=True)


def test_dirty_means_changed_code_not_the_results_being_written(tmp_path):
    (tmp_path / "training" / "results").mkdir(parents=True)
    (tmp_path / "pkg").mkdir()
    files = {"pkg/follower.py": "x = 1\n", "training/results/closed_loop.json": "{}\n", "README.md": "# a\n",
             "training/RESULTS.md": "# r\n"}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    _commit_all(tmp_path, "init")
    clean = provenance.git_commit(tmp_path / "pkg")
    assert clean and not clean.endswith("-dirty")
    for name in ("training/results/closed_loop.json", "README.md", "training/RESULTS.md"):
        (tmp_path / name).write_text("changed\n")
    assert provenance.git_commit(tmp_path / "pkg") == clean  # a log half written, docs being edited
    (tmp_path / "pkg/follower.py").write_text("x = 2\n")
    assert provenance.git_commit(tmp_path / "pkg") == f"{clean}-dirty"
