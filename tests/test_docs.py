"""The built documentation site (docs/_build/html) renders, with its images, and offline.

Build it first (the `docs` extra)::

    python -m sphinx -W --keep-going -b html docs docs/_build/html

Without a built site these tests skip, except those of the sources. The browser test opens
pages in headless Chromium through selenium and /usr/bin/chromedriver (Debian packages chromium,
chromium-driver; skipped without them); the other tests parse the HTML and CSS.
"""

import functools
import http.server
import pathlib
import re
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
    "theory.html": "Theory",  # math, rendered by the site's own MathJax
}
MATHJAX = "_static/mathjax/tex-chtml.js"  # served by the site (sphinx-mathjax-offline)

needs_site = pytest.mark.skipif(
    not (HTML / "index.html").is_file(), reason=f"documentation not built (run `{BUILD}`)"
)


class _Page(HTMLParser):
    """Title, image sources, link targets and loaded resources of one HTML page."""

    def __init__(self, path):
        super().__init__()
        self.title, self.images, self.links, self._in_title = "", [], [], False
        self.scripts, self.resources, self._in_style, self.styles = [], [], False, []
        self.feed(path.read_text(encoding="utf-8"))

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "title":
            self._in_title = True
        elif tag == "img" and attrs.get("src"):
            self.images.append(attrs["src"])
        elif tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag == "script" and attrs.get("src"):
            self.scripts.append(attrs["src"])
        # what a browser fetches on its own: scripts, stylesheets, fonts and other preloads,
        # icons, images and frames (not the targets of links, which load only when followed)
        if tag in ("script", "img", "iframe", "embed", "source", "audio", "video", "input"):
            self.resources += [(tag, attrs[a]) for a in ("src", "srcset") if attrs.get(a)]
        elif tag == "link" and attrs.get("href") and attrs.get("rel", "") not in LINK_NAVIGATION:
            self.resources.append((f"link rel={attrs.get('rel')}", attrs["href"]))
        elif tag == "object" and attrs.get("data"):
            self.resources.append((tag, attrs["data"]))
        if attrs.get("style"):
            self.styles.append(attrs["style"])
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        if tag == "title":
            self._in_title = False
        self._in_style = False

    def handle_data(self, data):
        if self._in_title:
            self.title += data
        if self._in_style:
            self.styles.append(data)


# <link rel=...> values that only name another page (navigation, search engines), loading nothing
LINK_NAVIGATION = {"index", "search", "next", "prev", "canonical", "alternate", "author",
                   "help", "license", "copyright", "top", "up"}
# url(...) and @import in CSS: fonts, images and other stylesheets it fetches
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")\s]+)|@import\s+['"]([^'"]+)""")


def _external(url):
    """Whether a browser would fetch ``url`` from another host (protocol-relative included)."""
    parts = urlsplit(url.strip())
    return bool(parts.netloc) or parts.scheme not in ("", "data", "blob")


def _local_target(page, url):
    """The file a relative link or image source of ``page`` points to (None if external)."""
    parts = urlsplit(url)
    if parts.scheme or parts.netloc or not parts.path:
        return None
    return (page.parent / unquote(parts.path)).resolve()


@needs_site
@pytest.mark.parametrize("page", PAGES)
def test_page_has_its_title_and_images_on_disk(page):
    parsed = _Page(HTML / page)
    assert PAGES[page] in parsed.title
    assert parsed.images, f"{page} shows no image"
    for src in parsed.images:
        target = _local_target(HTML / page, src)
        assert target is None or target.is_file(), f"{page}: missing image {src}"


@needs_site
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


@needs_site
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


@needs_site
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


@needs_site
def test_no_page_loads_a_script_stylesheet_or_font_from_another_host():
    """The site reads offline: every script, stylesheet, font, icon and image a page or a
    stylesheet of the site fetches is a file of the site."""
    # _static holds the theme's assets (among them a Jinja template ending in .html), no page
    pages = sorted(p for p in HTML.rglob("*.html") if p.relative_to(HTML).parts[0] != "_static")
    assert len(pages) > 20
    external, missing = [], []
    for page in pages:
        parsed = _Page(page)
        css_urls = [u for style in parsed.styles for m in CSS_URL.findall(style) for u in m if u]
        for what, url in parsed.resources + [("style", u) for u in css_urls]:
            urls = [u.split()[0] for u in url.split(",")] if "srcset" in what else [url]
            for u in urls:
                if _external(u):
                    external.append(f"{page.relative_to(HTML)}: {what} {u}")
                elif (target := _local_target(page, u)) is not None and not target.is_file():
                    missing.append(f"{page.relative_to(HTML)}: {what} {u}")
    for css in sorted(HTML.rglob("*.css")):
        for match in CSS_URL.findall(css.read_text(encoding="utf-8", errors="replace")):
            url = next(u for u in match if u)
            if _external(url):
                external.append(f"{css.relative_to(HTML)}: {url}")
            elif (target := _local_target(css, url)) is not None and not target.is_file():
                missing.append(f"{css.relative_to(HTML)}: {url}")
    assert not external, "fetched from another host:\n" + "\n".join(external[:20])
    assert not missing, "not in the site:\n" + "\n".join(missing[:20])


@needs_site
def test_math_is_rendered_by_the_sites_own_mathjax():
    theory = HTML / "theory.html"
    parsed = _Page(theory)
    mathjax = [src for src in parsed.scripts if "mathjax" in src.lower()]
    assert mathjax == [MATHJAX], mathjax
    assert (HTML / MATHJAX).is_file()
    # MathJax's CommonHTML output loads its fonts relative to its script
    fonts = list((HTML / "_static" / "mathjax" / "output" / "chtml" / "fonts").rglob("*.woff"))
    assert len(fonts) > 10
    text = theory.read_text(encoding="utf-8")
    assert 'class="math' in text and ("\\(" in text or "\\[" in text)  # math for MathJax


def _markdown_links(text):
    """Targets of the Markdown links and images of a page, outside code."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def test_markdown_pages_link_only_files_of_the_sources():
    """docs/*.md read on a code host (no build) have no dangling links: a link names a file of
    the repository, a web page or an anchor; pages made by the build (the example gallery) are
    reached through Sphinx references ({doc}), which work in the built site."""
    dangling = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        for target in _markdown_links(page.read_text(encoding="utf-8")):
            parts = urlsplit(target)
            if parts.scheme or parts.netloc or not parts.path:
                continue
            if not (page.parent / unquote(parts.path)).exists():
                dangling.append(f"{page.name}: {target}")
    assert not dangling, dangling


MATH_RENDERED = """
const done = arguments[arguments.length - 1];
const count = () => [document.querySelectorAll("mjx-container").length,
                     document.querySelectorAll(".math:not(:has(mjx-container))").length];
const ready = window.MathJax && MathJax.startup && MathJax.startup.promise;
(ready ? MathJax.startup.promise : Promise.resolve()).then(() => done(count()));
"""


@needs_site
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
        math = browser.execute_async_script(MATH_RENDERED)
        browser.save_screenshot(str(tmp_path / "page.png"))
        fetched = browser.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)"
        )
    finally:
        browser.quit()
    assert images, f"{page} shows no image"
    broken = [src for src, complete, width in images if not (complete and width > 0)]
    assert not broken, f"{page}: images that did not load: {broken}"
    elsewhere = [url for url in fetched if not url.startswith(site_url)]
    assert not elsewhere, f"{page} fetched from another host: {elsewhere}"
    if page == "theory.html":
        typeset, raw = math
        assert typeset > 5 and raw == 0, f"MathJax typeset {typeset} formulas, left {raw} raw"
