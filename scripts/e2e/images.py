#!/usr/bin/env python3
"""Builds the real-node scenario's container images as docker-archive tars, without a
registry: a pause image (a static C program that blocks in pause() and exits on
SIGTERM/SIGINT) and a busybox image (Debian's busybox-static and a symlink per applet).

    scripts/e2e/images.py OUT_DIR

Writes OUT_DIR/pause.tar (e2e.local/pause:1) and OUT_DIR/busybox.tar (e2e.local/busybox:1),
for `ctr -n k8s.io images import`. Needs gcc with a static libc (libc6-dev) and
/bin/busybox from busybox-static.
"""
import hashlib
import io
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile

PAUSE_C = r"""
#include <signal.h>
#include <unistd.h>
static void done(int sig) { (void)sig; _exit(0); }
int main(void) {
    signal(SIGTERM, done);
    signal(SIGINT, done);
    for (;;) pause();
}
"""


def layer(files):
    """A layer tar from [(path, bytes | None for a dir, mode, symlink target | None)]."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as t:
        for path, data, mode, link in files:
            info = tarfile.TarInfo(path)
            info.mtime = 0
            info.mode = mode
            if link is not None:
                info.type = tarfile.SYMTYPE
                info.linkname = link
                t.addfile(info)
            elif data is None:
                info.type = tarfile.DIRTYPE
                t.addfile(info)
            else:
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def image(out, tag, layer_tar, entrypoint):
    diff_id = "sha256:" + hashlib.sha256(layer_tar).hexdigest()
    config = json.dumps({
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "scripts/e2e/images.py"}],
    }).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{
        "Config": config_name,
        "RepoTags": [tag],
        "Layers": ["layer.tar"],
    }]).encode()
    with tarfile.open(out, mode="w") as t:
        for name, data in (("layer.tar", layer_tar), (config_name, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            t.addfile(info, io.BytesIO(data))


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: images.py OUT_DIR")
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp, "pause.c")
        src.write_text(PAUSE_C)
        binary = pathlib.Path(tmp, "pause")
        subprocess.run(["gcc", "-static", "-O2", "-o", str(binary), str(src)], check=True)
        image(out / "pause.tar", "e2e.local/pause:1",
              layer([("pause", binary.read_bytes(), 0o755, None)]), ["/pause"])
    busybox = pathlib.Path("/bin/busybox").read_bytes()
    applets = subprocess.run(["/bin/busybox", "--list"], check=True, capture_output=True,
                             text=True).stdout.split()
    files = [("bin", None, 0o755, None), ("tmp", None, 0o1777, None),
             ("bin/busybox", busybox, 0o755, None)]
    files += [(f"bin/{a}", None, 0o777, "busybox") for a in applets if a != "busybox"]
    image(out / "busybox.tar", "e2e.local/busybox:1", layer(files), ["/bin/sh"])
    print(out / "pause.tar")
    print(out / "busybox.tar")


if __name__ == "__main__":
    main()
