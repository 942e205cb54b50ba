"""tools/data_files.py on a temporary repository: a raw file recorded at a commit, then untracked and
deleted, comes back from git history byte for byte; a manifest whose hash is not the blob's is refused,
and a shallow clone that lacks the commit is told how to get it."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "data_files.py"
RAW = "results/run/parts/arrays.npz"
GIT_ENV = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          env=GIT_ENV).stdout.strip()


def _tool(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args, "--root", str(repo)], capture_output=True, text=True,
                          env=GIT_ENV, timeout=60)


def _repo_with_raw_file(tmp_path: Path) -> tuple[Path, bytes]:
    """A repository whose first commit holds RAW (binary) and whose second untracks it, with its manifest."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    data = bytes(range(256)) * 40 + b"\x00\r\n\x1a"  # bytes a text filter would change
    (repo / RAW).parent.mkdir(parents=True)
    (repo / RAW).write_bytes(data)
    _git(repo, "add", RAW)
    _git(repo, "commit", "-q", "-m", "raw arrays")
    added = _tool(repo, "add", RAW)
    assert added.returncode == 0, added.stderr
    _git(repo, "rm", "-q", "--cached", RAW)
    _git(repo, "add", "results/data_files.json")
    _git(repo, "commit", "-q", "-m", "raw arrays out of the tree")
    return repo, data


def test_fetch_brings_back_a_deleted_file_from_history_and_checks_its_hash(tmp_path):
    repo, data = _repo_with_raw_file(tmp_path)
    [entry] = json.loads((repo / "results/data_files.json").read_text())["files"]
    assert entry == {"path": RAW, "commit": _git(repo, "rev-parse", "HEAD~1"), "bytes": len(data),
                     "sha256": hashlib.sha256(data).hexdigest()}
    (repo / RAW).unlink()
    (repo / "results/run/parts").rmdir()
    check = _tool(repo, "check")
    assert check.returncode == 0 and f"missing   {RAW}" in check.stdout  # missing is no error: fetch brings it
    fetched = _tool(repo, "fetch")
    assert fetched.returncode == 0, fetched.stderr
    assert (repo / RAW).read_bytes() == data
    assert _tool(repo, "check").stdout.strip() == f"present   {RAW}"
    assert _tool(repo, "list").stdout.split("\t")[:3] == [RAW, str(len(data)), entry["sha256"]]
    # a changed file is a mismatch (check exits 1) and fetch puts the recorded bytes back
    (repo / RAW).write_bytes(data[:-1] + b"!")
    check = _tool(repo, "check")
    assert check.returncode == 1 and f"mismatch  {RAW}" in check.stdout
    assert _tool(repo, "fetch").returncode == 0 and (repo / RAW).read_bytes() == data


def test_a_tampered_manifest_hash_is_refused(tmp_path):
    repo, data = _repo_with_raw_file(tmp_path)
    manifest = repo / "results/data_files.json"
    doc = json.loads(manifest.read_text())
    doc["files"][0]["sha256"] = hashlib.sha256(b"something else").hexdigest()
    manifest.write_text(json.dumps(doc))
    (repo / RAW).unlink()
    fetched = _tool(repo, "fetch")
    assert fetched.returncode == 1 and "refused" in fetched.stderr and RAW in fetched.stderr
    assert not (repo / RAW).exists() and not list((repo / "results/run/parts").iterdir())  # nothing half-written


def test_a_shallow_clone_is_told_to_fetch_the_history(tmp_path):
    repo, data = _repo_with_raw_file(tmp_path)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(clone)], check=True, env=GIT_ENV)
    fetched = _tool(clone, "fetch")
    assert fetched.returncode == 1 and not (clone / RAW).exists()
    assert RAW in fetched.stderr and "git fetch --unshallow" in fetched.stderr
    _git(clone, "fetch", "-q", "--unshallow")
    assert _tool(clone, "fetch").returncode == 0 and (clone / RAW).read_bytes() == data
