"""The built documentation site (docs/_build/html) renders, with its images.

Build it first (the `docs` extra)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

Without a built site these tests skip. The browser test opens pages in headless Chromium through
selenium and /usr/bin/chromedriver (Debian packages chromium, chromium-driver; skipped without
them); the other tests parse the HTML.
"""

import functools
import http.server
import pathlib
import shutil
import sys
import threading
from html.parser import HTMLParser
from urllib.parse import unquote, urlsplit

import pytest

import skattention

ROOT = pathlib.Path(__file__).parents[1]
HTML = ROOT / "docs" / "_build" / "html"
BUILD = "python -m sphinx -W --keep-going -b html docs docs/_build/html"
PAGES = {  # page: words its title must contain
    "index.html": "skattention",
    "auto_examples/plot_diffusion_embedding.html": "Diffusion embedding",
}

pytestmark = pytest.mark.skipif(
    not (HTML / "index.html").is_file(), reason=f"documentation not built (run `{BUILD}`)"
)


class _Page(HTMLParser):
    """Title, image sources and link targets of one HTML page."""

    def __init__(self, path):
        super().__init__()
        self.title, self.images, self.links, self._in_title = "", [], [], False
        self.feed(path.read_text(encoding="utf-8"))

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "title":
            self._in_title = True
        elif tag == "img" and attrs.get("src"):
            self.images.append(attrs["src"])
        elif tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False

    def handle_data(self, data):
        if self._in_title:
            self.title += data


def _local_target(page, url):
    """The file a relative link or image source of ``page`` points to (None if external)."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or not parts.path:
        return None
    return (page.parent / unquote(parts.path)).resolve()


@pytest.mark.parametrize("page", PAGES)
def test_page_has_its_title_and_images_on_disk(page):
    parsed = _Page(HTML / page)
    assert PAGES[page] in parsed.title
    assert parsed.images, f"{page} shows no image"
    for src in parsed.images:
        target = _local_target(HTML / page, src)
        assert target is None or target.is_file(), f"{page}: missing image {src}"


def test_every_plot_example_is_in_the_gallery_with_its_figures():
    index = _Page(HTML / "auto_examples" / "index.html")
    for example in sorted((ROOT / "examples").glob("plot_*.py")):
        page = HTML / "auto_examples" / f"{example.stem}.html"
        assert page.is_file(), f"{example.name} has no gallery page: rebuild the docs"
        assert f"{example.stem}.html" in " ".join(index.links)
        thumbnail = f"sphx_glr_{example.stem}_thumb.png"
        assert any(src.endswith(thumbnail) for src in index.images), (
            f"no thumbnail for {example.name}"
        )
        figures = [src for src in _Page(page).images if f"sphx_glr_{example.stem}_0" in src]
        assert figures, f"{example.name} drew no figure in the gallery"


def test_gallery_execution_times_are_recorded():
    # the times themselves are a report (benchmarks/bench_gallery.py), not a test: they depend
    # on the machine and its load
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from bench_gallery import gallery_times
    finally:
        sys.path.pop(0)
    times = gallery_times(ROOT / "docs" / "auto_examples" / "sg_execution_times.rst")
    examples = {p.name for p in (ROOT / "examples").glob("plot_*.py")}
    assert set(times) == examples


def test_api_reference_has_a_page_for_every_public_name():
    from skattention import manifold, nn, plotting, utils

    names = [f"skattention.{n}" for n in skattention.__all__ if n != "__version__"]
    for module in (manifold, nn, plotting, utils):
        names += [
            f"skattention.{n}" if n in skattention.__all__ else f"{module.__name__}.{n}"
            for n in module.__all__
        ]
    missing = [n for n in names if not (HTML / "generated" / f"{n}.html").is_file()]
    assert not missing, f"API reference lacks {missing}"


def _browser():
    """A headless Chromium driven by selenium, or a skip saying what is missing."""
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium not installed")
    from selenium.webdriver.chrome.service import Service

    binary = next(
        filter(None, map(shutil.which, ["chromium", "chromium-browser", "google-chrome"])), None
    )
    driver = shutil.which("chromedriver")
    if binary is None or driver is None:
        pytest.skip(
            "no headless Chromium: install the Debian packages chromium and chromium-driver"
        )
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for arg in [
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        "--no-first-run", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--window-size=1280,1600",
    ]:  # fmt: skip
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(driver), options=options)


@pytest.fixture(scope="module")
def site_url():
    """The built site served on localhost, as a user's browser would get it."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(HTML))
    handler.func.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    thread.join()


IMAGES_LOADED = """
const done = arguments[arguments.length - 1];
const images = Array.from(document.images);
images.forEach(img => { img.loading = "eager"; });
const loaded = img => new Promise(r => { img.onload = img.onerror = r; });
Promise.all(images.map(img => img.complete ? null : loaded(img)))
  .then(() => done(images.map(img => [img.getAttribute("src"), img.complete, img.naturalWidth])));
"""


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_with_its_images_in_headless_chromium(page, site_url, tmp_path):
    browser = _browser()
    try:
        browser.set_script_timeout(30)
        browser.get(site_url + page)
        assert PAGES[page] in browser.title
        article = browser.execute_script(
            "const a = document.querySelector('article.bd-article, main');"
            "return a ? [a.innerText.length, a.getBoundingClientRect().height] : null;"
        )
        assert article and article[0] > 200 and article[1] > 200, f"{page}: no rendered content"
        images = browser.execute_async_script(IMAGES_LOADED)
        browser.save_screenshot(str(tmp_path / "page.png"))
    finally:
        browser.quit()
    assert images, f"{page} shows no image"
    broken = [src for src, complete, width in images if not (complete and width > 0)]
    assert not broken, f"{page}: images that did not load: {broken}"
