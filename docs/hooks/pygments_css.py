"""MkDocs hook: the stylesheet of the code highlighting, made at build time.

Code blocks are highlighted when the site is built (``pymdownx.highlight``
with Pygments: ``<span class="k">`` and so on); this writes the colours of
those classes, from Pygments' own ``default`` style, to ``css/pygments.css``
in the site (``extra_css`` in mkdocs.yml). The site then needs nothing from a
CDN to show highlighted code.
"""
from __future__ import annotations

from pathlib import Path

STYLESHEET = "css/pygments.css"


def on_post_build(config) -> None:
    from pygments.formatters import HtmlFormatter

    css = HtmlFormatter(style="default").get_style_defs(".highlight")
    # Long lines scroll inside their block instead of widening the page.
    css += "\n.highlight pre { overflow-x: auto; }\n"
    path = Path(config["site_dir"]) / STYLESHEET
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(css, encoding="utf-8")
