"""Time the draw-a-digit page in a real browser: from the end of a stroke to the guess on screen.

    python benchmarks/page_speed.py --checkpoint checkpoints/mnist_mlp.pt
    python benchmarks/page_speed.py --screenshot docs/draw_a_digit.png   # also the README's picture

Starts `python predict.py --serve` as a user would, opens its page in headless Chromium
(Debian's `chromium`, or CHROMIUM=/path/to/chrome) with Playwright, and draws 20 digits with
real pointer events, one stroke at a time. The page itself records, for every stroke, the time
from the pointer going up to the frame that shows the answer: the PNG is made, sent, read,
cleaned up and classified, and the answer drawn. Prints the median and the slowest.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from playwright.sync_api import sync_playwright

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.draw_samples import STROKES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--checkpoint", default="checkpoints/mnist_mlp.pt")
    parser.add_argument("--drawings", type=int, default=20)
    parser.add_argument("--screenshot", default=None, help="save a picture of the page here")
    args = parser.parse_args()
    chromium = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which(
        "chromium-browser")
    if chromium is None:
        sys.exit("no Chromium found: apt-get install chromium, or set CHROMIUM")
    server = subprocess.Popen([sys.executable, "-u", "predict.py", "--serve", "--port", "0",
                               "--checkpoint", args.checkpoint], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    try:
        first = server.stdout.readline()
        if not first.startswith("Open "):
            sys.exit(f"predict.py --serve did not start: {first}")
        url = first.split()[1]
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium,
                                                 args=["--no-sandbox"])
            page = browser.new_page(viewport={"width": 760, "height": 560})
            page.goto(url)
            guesses = []
            for n in range(args.drawings):
                digit = n % 10
                page.click("#clear")
                box = page.locator("#pad").bounding_box()
                for stroke in STROKES[digit]:
                    done = page.evaluate("window.strokeTimes.length")
                    points = [(box["x"] + (0.15 + 0.7 * x) * box["width"],
                               box["y"] + (0.12 + 0.76 * y) * box["height"])
                              for x, y in stroke]
                    page.mouse.move(*points[0])
                    page.mouse.down()
                    for point in points[1:]:
                        page.mouse.move(*point, steps=2)
                    page.mouse.up()
                    page.wait_for_function(f"window.strokeTimes.length > {done}")
                guesses.append((digit, page.inner_text("#guess")))
            times = page.evaluate("window.strokeTimes")
            if args.screenshot:
                page.click("#clear")
                box = page.locator("#pad").bounding_box()
                for stroke in STROKES[3]:
                    done = page.evaluate("window.strokeTimes.length")
                    page.mouse.move(box["x"] + (0.15 + 0.7 * stroke[0][0]) * box["width"],
                                    box["y"] + (0.12 + 0.76 * stroke[0][1]) * box["height"])
                    page.mouse.down()
                    for x, y in stroke[1:]:
                        page.mouse.move(box["x"] + (0.15 + 0.7 * x) * box["width"],
                                        box["y"] + (0.12 + 0.76 * y) * box["height"], steps=2)
                    page.mouse.up()
                    page.wait_for_function(f"window.strokeTimes.length > {done}")
                page.wait_for_timeout(300)
                page.screenshot(path=args.screenshot, full_page=True)
                print(f"wrote {args.screenshot}")
            browser.close()
    finally:
        server.terminate()
        server.wait()
    right = sum(str(d) == g for d, g in guesses)
    print(f"{args.drawings} drawings, {len(times)} strokes ({args.checkpoint}): stroke end to "
          f"guess on screen, median {statistics.median(times):.0f} ms, slowest "
          f"{max(times):.0f} ms; {right} of {len(guesses)} drawings read right"
          + "".join(f"; a {d} read as {g}" for d, g in guesses if str(d) != g))


if __name__ == "__main__":
    main()
