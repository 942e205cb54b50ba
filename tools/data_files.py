"""Raw result arrays kept out of the tracked tree, brought back from git history.

    python tools/data_files.py fetch    # write every missing or changed file into place, hash checked
    python tools/data_files.py check    # present / missing / mismatching per file (exit 1 on a mismatch)
    python tools/data_files.py list     # the manifest: path, bytes, SHA-256, commit
    python tools/data_files.py add PATH...  # record files as HEAD holds them (commit them first)

Every GPU device call carries the working tree (with wheels and compiled-program caches) under a
64 MiB limit, so raw arrays (stored rollouts, Gram matrices: .npz) are not tracked at the tip; each
one stays in a commit of this repository's history. results/data_files.json lists them: path,
the commit that holds it, size and SHA-256. `fetch` reads the blob with plain git
(`git cat-file blob COMMIT:PATH`) and writes it only when its SHA-256 is the manifest's, so a
wrong manifest or a damaged object is refused rather than written. A clone that lacks the commit
(a shallow clone) is told to fetch the history first.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "results/data_files.json"
ABOUT = ("Raw result arrays kept out of the tracked tree: each one is the blob at path in commit; "
         "`python tools/data_files.py fetch` writes them into place and checks their sha256.")


class DataFileError(RuntimeError):
    """A file that cannot be brought back: the message names it and how to fix it."""


def _git(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, check=check)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_manifest(root: Path, manifest: str = MANIFEST) -> list[dict]:
    entries = json.loads((root / manifest).read_text(encoding="utf-8"))["files"]
    for e in entries:
        missing = {"path", "commit", "bytes", "sha256"} - set(e)
        if missing:
            raise DataFileError(f"{manifest}: entry {e.get('path', e)} lacks {sorted(missing)}")
    return entries


def write_manifest(root: Path, entries: list[dict], manifest: str = MANIFEST) -> None:
    entries = sorted(entries, key=lambda e: e["path"])
    text = json.dumps({"about": ABOUT, "files": entries}, indent=1) + "\n"
    (root / manifest).parent.mkdir(parents=True, exist_ok=True)
    (root / manifest).write_text(text, encoding="utf-8")


def status(root: Path, entry: dict) -> str:
    """'present' (the manifest's bytes), 'missing' or 'mismatch'."""
    path = root / entry["path"]
    if not path.is_file():
        return "missing"
    if path.stat().st_size != entry["bytes"] or file_sha256(path) != entry["sha256"]:
        return "mismatch"
    return "present"


def blob(root: Path, entry: dict) -> bytes:
    """The file's bytes from git history, checked against the manifest's size and SHA-256."""
    path, commit = entry["path"], entry["commit"]
    if _git(root, "cat-file", "-e", f"{commit}^{{commit}}", check=False).returncode != 0:
        shallow = _git(root, "rev-parse", "--is-shallow-repository", check=False).stdout.decode().strip() == "true"
        raise DataFileError(
            f"{path}: commit {commit} is not in this clone{' (a shallow clone)' if shallow else ''}. "
            f"Fetch the history, then run `python tools/data_files.py fetch` again: "
            f"{'`git fetch --unshallow`' if shallow else f'`git fetch origin {commit}` (or `git fetch --unshallow`)'}.")
    got = _git(root, "cat-file", "blob", f"{commit}:{path}", check=False)
    if got.returncode != 0:
        raise DataFileError(f"{path}: commit {commit} holds no such file ({got.stderr.decode().strip()}); "
                            f"the manifest {MANIFEST} names the wrong commit or path")
    data = got.stdout
    if len(data) != entry["bytes"] or sha256(data) != entry["sha256"]:
        raise DataFileError(f"{path}: {commit}:{path} has {len(data)} bytes, SHA-256 {sha256(data)}; the manifest says "
                            f"{entry['bytes']} bytes, {entry['sha256']}: refused (is {MANIFEST} edited by hand?)")
    return data


def fetch(root: Path, entries: list[dict]) -> list[str]:
    """Writes every missing or mismatching file; returns the errors (one per file that failed)."""
    errors = []
    for e in entries:
        state = status(root, e)
        if state == "present":
            print(f"present   {e['path']}")
            continue
        try:
            data = blob(root, e)
        except DataFileError as err:
            errors.append(str(err))
            print(f"FAILED    {err}", file=sys.stderr)
            continue
        path = root / e["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".partial")
        tmp.write_bytes(data)
        os.replace(tmp, path)  # never a half-written file under the real name
        print(f"{'fetched ' if state == 'missing' else 'replaced'}  {e['path']} ({len(data)} bytes from {e['commit'][:12]})")
    return errors


def add(root: Path, entries: list[dict], paths: list[str]) -> list[dict]:
    """Records `paths` (relative to root, or absolute) as HEAD holds them; the working file must be HEAD's."""
    head = _git(root, "rev-parse", "HEAD").stdout.decode().strip()
    by_path = {e["path"]: e for e in entries}
    for p in paths:
        p = (root / p).resolve().relative_to(root.resolve()).as_posix()
        entry = {"path": p, "commit": head}
        got = _git(root, "cat-file", "blob", f"{head}:{p}", check=False)
        if got.returncode != 0:
            raise DataFileError(f"{p}: HEAD ({head[:12]}) holds no such file: commit it first, then add it")
        entry.update(bytes=len(got.stdout), sha256=sha256(got.stdout))
        if (root / p).is_file() and file_sha256(root / p) != entry["sha256"]:
            raise DataFileError(f"{p}: the working file differs from HEAD's: commit it first, then add it")
        by_path[p] = entry
    return list(by_path.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("fetch", "check", "list", "add"))
    parser.add_argument("paths", nargs="*", help="for add: the files to record")
    parser.add_argument("--root", type=Path, default=ROOT, help="the repository (default: this tool's)")
    parser.add_argument("--manifest", default=MANIFEST, help="relative to --root")
    args = parser.parse_args(argv)
    root = args.root
    try:
        if args.command == "add":
            if not args.paths:
                parser.error("add needs the files to record")
            entries = read_manifest(root, args.manifest) if (root / args.manifest).is_file() else []
            write_manifest(root, add(root, entries, args.paths), args.manifest)
            print(f"{args.manifest}: recorded {len(args.paths)} file(s) at HEAD")
            return 0
        entries = read_manifest(root, args.manifest)
        if args.command == "list":
            for e in entries:
                print(f"{e['path']}\t{e['bytes']}\t{e['sha256']}\t{e['commit']}")
            return 0
        if args.command == "check":
            states = {e["path"]: status(root, e) for e in entries}
            for p, s in states.items():
                print(f"{s:<9} {p}")
            if "missing" in states.values():
                print("missing files: `python tools/data_files.py fetch` brings them back", file=sys.stderr)
            if "mismatch" in states.values():
                print("mismatching files differ from the manifest's SHA-256: `python tools/data_files.py fetch` "
                      "replaces them (keep a copy first if they are new results)", file=sys.stderr)
                return 1
            return 0
        errors = fetch(root, entries)
        return 1 if errors else 0
    except DataFileError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
