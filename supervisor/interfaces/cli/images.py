"""``sandvisor images``: build the sandbox images offline and show whether they are up to date."""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
from typing import TYPE_CHECKING, Any, TextIO

from supervisor.core.errors import SupervisorError
from supervisor.interfaces.cli.common import HelpFormatter, fail, print_json, print_table

if TYPE_CHECKING:
    from supervisor.tooling.images import BuildProgress, BuildResult

#: The images ``supervisor.tooling.images.IMAGES`` builds, for the help texts. Spelled out
#: here so that registering the command does not import the builder (and the docker SDK)
#: on every ``sandvisor`` start; a unit test keeps the two equal.
IMAGES: tuple[str, ...] = ("minimal", "debian", "dev")

IMAGES_EPILOG = """\
examples:
  sandvisor images build                 build every image whose sources changed
  sandvisor images list                  name, tag, id, size, created, up to date
"""

BUILD_EPILOG = f"""\
Each image is tagged sandvisor/<name>:<hash of its sources> and sandvisor/<name>:latest;
an image whose sources did not change is not rebuilt. Images: {", ".join(IMAGES)}.
Images whose base cannot be pulled (no registry) are built offline: debian and dev with
debootstrap from the host's Debian mirror (needs root), minimal from Debian's
busybox-static package.

examples:
  sandvisor images build                 all images, only when their sources changed
  sandvisor images build minimal         just one
  sandvisor images build --force debian  rebuild from scratch, without the build cache
  sandvisor images build --offline       never try to pull a base image
"""

LIST_EPILOG = """\
UP TO DATE is yes (built from the current sources), no (stale: run `sandvisor images build`)
or missing.

examples:
  sandvisor images list
  sandvisor images list --json | jq '.[] | select(.state != "yes") | .name'
"""


class BuildDisplay:
    """Build progress: a live status line per step on a terminal, one line per step if piped."""

    def __init__(self, stream: TextIO, *, live: bool) -> None:
        self._stream = stream
        self._live = live
        self._key: tuple[str, str] | None = None
        self._open = False

    def __call__(self, event: BuildProgress) -> None:
        key = (event.image, event.step)
        new_step = key != self._key
        self._key = key
        if self._live:
            text = f"[{event.image}] {event.elapsed_s:6.1f}s  {event.step}"
            if event.detail:
                text += f"  {event.detail}"
            # A line wider than the terminal wraps, and \r would then only redraw its tail.
            width = max(20, shutil.get_terminal_size().columns - 1)
            if new_step and self._open:
                self._stream.write("\n")
            self._stream.write("\r\033[K" + text[:width])
            self._open = True
        elif new_step:
            text = f"[{event.image}] {event.elapsed_s:.1f}s {event.step}"
            if event.detail:
                text += f": {event.detail}"
            self._stream.write(text + "\n")
        self._stream.flush()

    def end_line(self) -> None:
        """Finish the live line, so what follows starts on a line of its own."""
        if self._open:
            self._stream.write("\n")
            self._stream.flush()
            self._open = False
        self._key = None

    def result(self, result: BuildResult) -> None:
        """One summary line per image."""
        self.end_line()
        short = result.image_id.removeprefix("sha256:")[:12]
        if result.built:
            line = (
                f"[{result.name}] built {result.tag} ({short}) in {result.seconds:.1f}s "
                f"via {result.method}"
            )
        else:
            line = f"[{result.name}] up to date: {result.tag} ({short}), nothing to build"
        self._stream.write(line + "\n")
        self._stream.flush()


def _build(args: argparse.Namespace) -> int:
    from supervisor.tooling.images import build as build_image  # noqa: PLC0415
    from supervisor.tooling.images import connect  # noqa: PLC0415

    unknown = [n for n in args.names if n not in IMAGES]
    if unknown:
        return fail(f"unknown image {', '.join(unknown)}; known images: {', '.join(IMAGES)}", 2)
    names = list(dict.fromkeys(args.names)) or list(IMAGES)
    display = BuildDisplay(sys.stdout, live=sys.stdout.isatty())
    # A plain SIGTERM would skip the finally blocks that stop debootstrap, unmount its /proc
    # and delete the ~400 MB scratch root filesystem; exiting through SystemExit runs them.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        client = connect()
        try:
            for name in names:
                result = build_image(
                    name, progress=display, force=args.force, pull=not args.offline, client=client
                )
                display.result(result)
        finally:
            client.close()
    except SupervisorError as exc:
        display.end_line()
        return fail(str(exc))
    except OSError as exc:
        # Disk full or a permission problem in the build or scratch folder.
        display.end_line()
        return fail(f"image build failed: {exc}")
    except KeyboardInterrupt:
        display.end_line()
        raise
    return 0


def _exit_on_sigterm(signum: int, _frame: object) -> None:
    sys.exit(128 + signum)


def _human_size(size: int | None) -> str:
    if size is None:
        return "-"
    value = float(size)
    for unit in ("B", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


def _list(args: argparse.Namespace) -> int:
    from supervisor.tooling.images import connect, image_status  # noqa: PLC0415

    try:
        client = connect()
        try:
            statuses = [image_status(client, name) for name in IMAGES]
        finally:
            client.close()
    except SupervisorError as exc:
        return fail(str(exc))
    if args.json:
        print_json([s.model_dump(mode="json") for s in statuses])
        return 0
    rows: list[list[Any]] = []
    for s in statuses:
        rows.append(
            [
                s.name,
                f"{s.repository}:{s.built_hash or '?'}" if s.present else "-",
                s.image_id.removeprefix("sha256:")[:12] if s.image_id else "-",
                _human_size(s.size_bytes),
                s.created.astimezone().strftime("%Y-%m-%d %H:%M:%S") if s.created else "-",
                s.state,
            ]
        )
    print_table(["name", "tag", "id", "size", "created", "up to date"], rows)
    return 0


def register(subparsers: Any) -> None:
    """Add ``sandvisor images build`` and ``sandvisor images list``."""
    parser = subparsers.add_parser(
        "images",
        help="build and list the sandbox images (offline)",
        description="Build the sandbox images the policies run tasks in, and show their state.",
        epilog=IMAGES_EPILOG,
        formatter_class=HelpFormatter,
    )

    def usage(_args: argparse.Namespace) -> int:
        parser.print_help()
        return 2

    parser.set_defaults(func=usage)
    subs = parser.add_subparsers(dest="images_command", metavar="SUBCOMMAND")

    build = subs.add_parser(
        "build",
        help="build images whose sources changed",
        description="Build sandbox images offline, only when their sources changed.",
        epilog=BUILD_EPILOG,
        formatter_class=HelpFormatter,
    )
    build.add_argument(
        "names",
        nargs="*",
        metavar="NAME",
        help=f"images to build (default: all: {', '.join(IMAGES)})",
    )
    build.add_argument(
        "--force", action="store_true", help="rebuild even when up to date, without build cache"
    )
    build.add_argument(
        "--offline",
        action="store_true",
        help="never pull a base image; build from Debian packages instead",
    )
    build.set_defaults(func=_build)

    listing = subs.add_parser(
        "list",
        help="show each image: tag, id, size, created, up to date",
        description="Show each sandbox image and whether it was built from the current sources.",
        epilog=LIST_EPILOG,
        formatter_class=HelpFormatter,
    )
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(func=_list)
