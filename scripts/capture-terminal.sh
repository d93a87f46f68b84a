#!/usr/bin/env bash
# Capture the terminal-rendering corpus (issue 25): real tools run in sandvisor/dev, offline.
#
#   scripts/capture-terminal.sh [NAME ...]   # default: every item
#
# Writes tests/data/terminal/<name>.raw (the bytes exactly as a task's output file would
# hold them: stdout and stderr merged) and <name>.golden (their rendering by
# supervisor.core.terminal, to review by eye before committing). Every container runs with
# --network none; the "downloads" come from a throttled HTTP server on the container's own
# loopback, so the progress bars have many frames. Items marked "tty" run under `docker run
# -t` (a pseudo-terminal, 100x30), which is what makes pip, npm and apt draw their bars.
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
out="$here/tests/data/terminal"
image="${SANDVISOR_DEV_IMAGE:-sandvisor/dev:latest}"
py="${PYTHON:-$here/.venv/bin/python}"
[[ -x "$py" ]] || py=python3
mkdir -p "$out"

# Helpers every item can use inside the container (mounted read-only at /capture).
helpers=$(mktemp -d)
trap 'rm -rf "$helpers"' EXIT
cat >"$helpers/serve.py" <<'PY'
"""A throttled static file server on 127.0.0.1:8765 (64 KiB per 50 ms)."""
import http.server, sys, time, os
os.chdir(sys.argv[1])
class Slow(http.server.SimpleHTTPRequestHandler):
    def copyfile(self, src, dst):
        while chunk := src.read(65536):
            dst.write(chunk); dst.flush(); time.sleep(0.05)
    def log_message(self, *a): pass
http.server.ThreadingHTTPServer(("127.0.0.1", 8765), Slow).serve_forever()
PY
cat >"$helpers/wheel.py" <<'PY'
"""Write demo_pkg-1.0-py3-none-any.whl (3 MB of incompressible data) into argv[1]."""
import base64, hashlib, os, sys, zipfile
name = os.path.join(sys.argv[1], "demo_pkg-1.0-py3-none-any.whl")
files = {
    "demo_pkg/__init__.py": b"VERSION = '1.0'\n",
    "demo_pkg/blob.bin": os.urandom(3 << 20),
    "demo_pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n",
    "demo_pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: capture\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
}
record = ""
for path, data in files.items():
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record += f"{path},sha256={digest},{len(data)}\n"
record += "demo_pkg-1.0.dist-info/RECORD,,\n"
with zipfile.ZipFile(name, "w", zipfile.ZIP_STORED) as z:
    for path, data in files.items():
        z.writestr(path, data)
    z.writestr("demo_pkg-1.0.dist-info/RECORD", record)
PY
cat >"$helpers/tqdm_style.py" <<'PY'
"""A loop drawing its bar the way tqdm does: on stderr, redrawn after each \r."""
import sys, time
total = 120
for i in range(total + 1):
    frac = i / total
    bar = "\u2588" * int(frac * 30) + " " * (30 - int(frac * 30))
    sys.stderr.write(f"\rtraining: {frac:4.0%}|{bar}| {i}/{total} [00:0{i // 40}<00:00, {40 + i % 7}.{i % 10}it/s]")
    sys.stderr.flush()
    time.sleep(0.005)
sys.stderr.write("\n")
print("best loss 0.0421 at epoch 117")
PY
cat >"$helpers/buildkit_style.py" <<'PY'
"""A docker build (BuildKit) style display: a block of lines redrawn in place by moving the
cursor up (ESC[nA), to column 1, and erasing each line (ESC[2K) before writing it again."""
import sys, time
steps = [
    "[internal] load build definition from Dockerfile",
    "[internal] load metadata for docker.io/library/python:3.12-slim",
    "[1/4] FROM docker.io/library/python:3.12-slim",
    "[2/4] COPY requirements.txt .",
    "[3/4] RUN pip install -r requirements.txt",
    "[4/4] COPY . .",
    "exporting to image",
]
w = sys.stdout.write
drawn = 0
w("\x1b[?25l")
for tick in range(60):
    done = min(len(steps), tick // 8)
    lines = [f"\x1b[34m[+] Building {tick * 0.1:.1f}s ({done}/{len(steps)})\x1b[0m"]
    for i, step in enumerate(steps[: done + 1]):
        if i < done:
            lines.append(f"\x1b[34m => {step:<62} {0.1 * (i + 1):.1f}s\x1b[0m")
        else:
            lines.append(f" => {step:<62} {tick * 0.1 - i * 0.8:.1f}s")
            lines.append(f" => => # step output line {tick}")
    if drawn:
        w(f"\x1b[{drawn}A\x1b[1G")
    for line in lines:
        w(f"\x1b[2K{line}\n")
    for _ in range(drawn - len(lines)):
        w("\x1b[2K\n")
    if drawn > len(lines):
        w(f"\x1b[{drawn - len(lines)}A")
    drawn = max(drawn, len(lines))
    sys.stdout.flush()
    time.sleep(0.01)
w("\x1b[?25h")
print("\x1b[32mnaming to docker.io/library/app:latest done\x1b[0m")
PY

run() {  # run NAME [tty] -- SCRIPT : the script runs as sh -c in a fresh container
  local name=$1 tty=$2 script=$3
  local flags=(--rm --network none -v "$helpers:/capture:ro" -e HOME=/tmp -e TERM=xterm-256color)
  [[ $tty == tty ]] && flags+=(-t)
  printf 'capture: %s\n' "$name" >&2
  docker run "${flags[@]}" "$image" sh -c "$script" >"$out/$name.raw" 2>&1 || true
}

prelude_tty='stty cols 100 rows 30 2>/dev/null; '
serve='mkdir -p /tmp/w && python3 /capture/wheel.py /tmp/w && (python3 /capture/serve.py /tmp/w &) && sleep 0.5; '
pip_cmd='pip install --no-cache-dir --no-index --find-links http://127.0.0.1:8765/ --target /tmp/site'

want() { [[ $# -eq 0 ]] && return 0; local n; for n in "${selected[@]}"; do [[ $n == "$1" ]] && return 0; done; return 1; }
selected=("$@")
pick() { [[ ${#selected[@]} -eq 0 ]] || want "$1"; }

pick pip-plain && run pip-plain no "$serve $pip_cmd demo_pkg 2>&1"
pick pip-progress && run pip-progress tty "$prelude_tty $serve $pip_cmd --progress-bar on demo_pkg"
pick npm-install && run npm-install tty "$prelude_tty"'
  mkdir -p /tmp/pkg /tmp/app && cd /tmp/pkg &&
  printf "{\"name\":\"demo-lib\",\"version\":\"1.0.0\",\"main\":\"index.js\"}" > package.json &&
  echo "module.exports = 42;" > index.js && npm pack --silent >/dev/null &&
  cd /tmp/app && printf "{\"name\":\"app\",\"version\":\"0.0.1\"}" > package.json &&
  npm install --offline --no-audit --no-fund --color=always /tmp/pkg/demo-lib-1.0.0.tgz'
pick pytest-color && run pytest-color no '
  mkdir -p /tmp/t && cd /tmp/t && cat > test_demo.py <<EOF
def test_ok():
    assert 1 + 1 == 2

def test_fails():
    assert {"a": 1, "b": 2} == {"a": 1, "b": 3}
EOF
  pytest --color=yes -p no:cacheprovider test_demo.py 2>&1'
pick tqdm-loop && run tqdm-loop no 'python3 /capture/tqdm_style.py 2>&1'
pick curl-progress && run curl-progress no "$serve"' curl -# -o /tmp/got.whl http://127.0.0.1:8765/demo_pkg-1.0-py3-none-any.whl 2>&1 && ls -l /tmp/got.whl | awk "{print \$5, \$9}"'
pick apt-install && run apt-install tty "$prelude_tty"'
  mkdir -p /tmp/deb/DEBIAN /tmp/deb/usr/share/demo-tool &&
  printf "Package: demo-tool\nVersion: 1.0\nArchitecture: all\nMaintainer: capture <capture@example.invalid>\nDescription: a package built offline\n" > /tmp/deb/DEBIAN/control &&
  head -c 200000 /dev/urandom > /tmp/deb/usr/share/demo-tool/data &&
  dpkg-deb --build /tmp/deb /tmp/demo-tool_1.0_all.deb >/dev/null &&
  apt-get install -y -o Dpkg::Progress-Fancy=1 /tmp/demo-tool_1.0_all.deb'
pick buildkit-redraw && run buildkit-redraw no 'python3 /capture/buildkit_style.py 2>&1'

printf 'capture: rendering the goldens\n' >&2
PYTHONPATH="$here" "$py" - "$out" <<'PY'
import pathlib, sys
from supervisor.core.terminal import render
for raw in sorted(pathlib.Path(sys.argv[1]).glob("*.raw")):
    raw.with_suffix(".golden").write_text(render(raw.read_bytes()).text, encoding="utf-8")
    print(f"{raw.stem}: {raw.stat().st_size} bytes -> {len(render(raw.read_bytes()).text)} chars")
PY
