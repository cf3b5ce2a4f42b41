"""The draw-a-digit page in a real browser: headless Chromium, driven by Playwright.

Needs Chromium (Debian's `chromium` package; .ci/run installs it when it runs as root) and the
`playwright` package from PyPI; Playwright's own browser download is not used. Without them
the tests are skipped, with the reason.
"""

import base64
import json
import os
import shutil

import pytest
from helpers import digit_picture

import predict
from benchmarks.draw_samples import STROKES

pytest.importorskip("playwright.sync_api", reason="the browser test needs Playwright: "
                    "pip install playwright (the browser itself comes from the system)")
from playwright.sync_api import sync_playwright  # noqa: E402

CHROMIUM = next((path for path in [os.environ.get("CHROMIUM"), *map(
    shutil.which, ("chromium", "chromium-browser", "google-chrome"))]
                 if path and os.path.exists(path)), None)
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium found: apt-get install "
                                "chromium, or set CHROMIUM to a Chromium or Chrome binary")


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as playwright:
        ## --no-sandbox: Chromium's sandbox cannot start as root, which CI runs as.
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser, page_server):
    context = browser.new_context(viewport={"width": 375, "height": 800})
    tab = context.new_page()
    tab.goto(f"http://127.0.0.1:{page_server}/")
    yield tab
    context.close()


def draw(page, digit):
    """Draw the digit's strokes on the canvas with real pointer events, as a mouse would."""
    box = page.locator("#pad").bounding_box()
    for stroke in STROKES[digit]:
        points = [(box["x"] + (0.15 + 0.7 * x) * box["width"],
                   box["y"] + (0.12 + 0.76 * y) * box["height"]) for x, y in stroke]
        page.mouse.move(*points[0])
        page.mouse.down()
        for point in points[1:]:
            page.mouse.move(*point, steps=3)
        page.mouse.up()


def wait_for_answers(page, count):
    """Wait until `count` strokes' answers are on screen: the page counts each one after it has
    shown it (window.strokeTimes, for benchmarks/page_speed.py)."""
    page.wait_for_function(f"window.strokeTimes.length >= {count}", timeout=60_000)


def classified_by_the_command_line(tmp_path, checkpoint, picture_bytes, name, capsys):
    (tmp_path / name).write_bytes(picture_bytes)
    assert predict.main(["--checkpoint", str(checkpoint), "--json", str(tmp_path / name)]) == 0
    return json.loads(capsys.readouterr().out)[0]


def test_drawing_a_digit_shows_the_command_lines_guess_and_what_the_model_saw(
        page, trained_checkpoint, tmp_path, capsys):
    draw(page, 7)
    wait_for_answers(page, len(STROKES[7]))
    shown = page.inner_text("#guess")
    canvas_png = base64.b64decode(page.evaluate(
        "document.getElementById('pad').toDataURL('image/png')").split(",")[1])
    expected = classified_by_the_command_line(tmp_path, trained_checkpoint, canvas_png,
                                              "canvas.png", capsys)
    assert shown == str(expected["prediction"])
    ## "what the model saw" holds the 28x28 input: white strokes on black
    ink = page.evaluate("""() => {
        const data = document.getElementById('seen').getContext('2d')
            .getImageData(0, 0, 28, 28).data;
        let sum = 0; for (let i = 0; i < data.length; i += 4) sum += data[i];
        return sum / 255; }""")
    assert 30 < ink < 400  # MNIST digits hold about 100 pixels' worth of ink
    bars = page.locator("#bars .bar").count()
    assert bars == 10
    assert "model: mlp" in page.inner_text("#model") and "epoch" in page.inner_text("#model")


def test_a_photo_chosen_with_the_file_button_is_classified(page, trained_checkpoint, tmp_path,
                                                          capsys):
    digit_picture(4).save(tmp_path / "photo.jpg", quality=85)
    expected = classified_by_the_command_line(
        tmp_path, trained_checkpoint, (tmp_path / "photo.jpg").read_bytes(), "again.jpg", capsys)
    page.set_input_files("#file", str(tmp_path / "photo.jpg"))
    page.wait_for_function("document.getElementById('guess').textContent !== '?'")
    assert page.inner_text("#guess") == str(expected["prediction"])


def test_a_picture_that_is_not_one_shows_the_servers_error(page, tmp_path):
    (tmp_path / "notes.png").write_bytes(b"not a picture at all")
    page.set_input_files("#file", str(tmp_path / "notes.png"))
    page.wait_for_function("document.getElementById('warning').textContent !== ''")
    assert "is not an image" in page.inner_text("#warning")


def test_a_picture_over_the_limit_shows_the_limit(page, tmp_path):
    (tmp_path / "huge.png").write_bytes(bytes(21 * 2**20))
    page.set_input_files("#file", str(tmp_path / "huge.png"))
    page.wait_for_function("document.getElementById('warning').textContent !== ''")
    assert page.inner_text("#warning") == "the picture is over the limit of 20 MB"


def test_clear_while_an_answer_is_on_its_way_leaves_the_pad_blank(page):
    ## The drawing's answer is held back until Clear has been pressed, as a big photo or a busy
    ## machine would hold it: when it comes, it must not appear on the cleared pad.
    page.evaluate("""() => { const real = window.fetch;
        window.handled = 0;  // answers the page's code has finished with
        window.fetch = async (...args) => {
            window.fetch = real;  // the next drawing's answer comes as usual
            const response = await real(...args);
            await new Promise((done) => { window.letItThrough = done; });
            const json = response.json.bind(response);
            response.json = async () => {
                const answer = await json();
                setTimeout(() => window.handled++);  // after the code that awaited it has run
                return answer;
            };
            return response;
        }; }""")
    draw(page, 1)
    page.wait_for_function("window.letItThrough !== undefined")  # the answer is in, held back
    page.click("#clear")
    page.evaluate("window.letItThrough()")
    page.wait_for_function("window.handled === 1")
    assert page.inner_text("#guess") == "?" and page.inner_text("#warning") == ""
    draw(page, 1)  # and the next drawing is answered as usual
    page.wait_for_function("document.getElementById('guess').textContent !== '?'")


def test_the_keyboard_reaches_clear_and_the_file_button_and_nothing_scrolls_sideways(page):
    reached = []
    for _ in range(6):
        page.keyboard.press("Tab")
        reached.append(page.evaluate("document.activeElement.id"))
    assert "clear" in reached and "choose" in reached
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 375  # the viewport's width: no sideways scrolling on a small phone


def test_the_page_shows_class_names_for_a_model_of_another_dataset(browser):
    ## A Fashion-MNIST checkpoint: the guess and the bars are named, not numbered.
    import threading

    from plumbing import digit_server

    names = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
             "Sneaker", "Bag", "Ankle boot"]
    answer = {"prediction": 4, "class": "Coat", "warning": None,
              "probabilities": [0.0] * 4 + [1.0] + [0.0] * 5, "input": [[0] * 28] * 28}
    server = digit_server.make_server("127.0.0.1", 0, lambda body: answer,
                                      {"model": "mlp", "checkpoint": "f.pt", "epoch": None,
                                       "classes": names})  # saved by code that kept no epoch
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()  # ends at once
    try:
        tab = browser.new_page()
        tab.goto(f"http://127.0.0.1:{server.server_port}/")
        tab.wait_for_function("document.getElementById('model').textContent !== ''")
        assert tab.inner_text("#model") == "model: mlp from f.pt"  # no "epoch null", no NaN%
        draw(tab, 1)
        tab.wait_for_function("document.getElementById('guess').textContent === 'Coat'")
        assert "Ankle boot" in tab.inner_text("#bars")
        tab.close()
    finally:
        server.shutdown()
        server.server_close()
