"""Every relative link of README.md and docs/*.md leads somewhere: to a file of the
checkout, and, with a ``#fragment``, to a heading of that page (GitHub's anchors); and
every page or file of docs/ that their prose names (``docs/QUEUES.md``) exists."""

import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md", *sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))]
FENCE = re.compile(r"^([ \t]*)```.*?^\1```", re.S | re.M)
CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\]\n]|\n(?!\n))*\]\(([^)\s]+)\)")  # [text](target), ![alt](target)
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*$", re.M)
NAMED = re.compile(r"(?<![\w/.-])docs/[\w.-]+\.(?:md|json|png)\b")  # docs/QUEUES.md in prose


def _prose(text):
    """The text without code blocks (a ``# comment`` in one is no heading, a link in one
    no link)."""
    return FENCE.sub("", text)


def anchors(text):
    """The anchors GitHub gives the page's headings: lower case, punctuation dropped,
    spaces to hyphens, ``-1``, ``-2``... after a repeat."""
    seen, out = {}, set()
    for title in HEADING.findall(_prose(text)):
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).replace("`", "")
        slug = re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def links(page, root=ROOT):
    """(target as written, the file it names, its fragment or None) of each relative link."""
    with open(os.path.join(root, page), encoding="utf-8") as f:
        text = CODE.sub("", _prose(f.read()))
    out = []
    for target in LINK.findall(text):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        full = os.path.normpath(os.path.join(root, os.path.dirname(page), path)) if path else os.path.join(root, page)
        out.append((target, full, fragment or None))
    return out


def broken(page, root=ROOT):
    bad = []
    with open(os.path.join(root, page), encoding="utf-8") as f:
        prose = CODE.sub("", _prose(f.read()))
    for name in sorted(set(NAMED.findall(prose))):
        if not os.path.exists(os.path.join(root, name)):
            bad.append(f"{name}: named, no such file")
    for target, full, fragment in links(page, root):
        if not os.path.exists(full):
            bad.append(f"{target}: no such file")
        elif fragment is not None:
            if not full.endswith(".md"):
                bad.append(f"{target}: an anchor into a file that is not a page")
                continue
            with open(full, encoding="utf-8") as f:
                if fragment not in anchors(f.read()):
                    bad.append(f"{target}: no heading with that anchor")
    return bad


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves(page):
    assert links(page) or page != "README.md"  # (the guard: the README links its pages)
    assert broken(page) == []


def test_a_broken_link_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "A.md").write_text("# A page\n\n## The `x` option: why\n\ntext\n\n## Again\n\n## Again\n")
    (tmp_path / "README.md").write_text(
        "[ok](docs/A.md) [ok](docs/A.md#the-x-option-why) [ok](docs/A.md#again-1) [self](#top)\n"
        "[gone](docs/B.md) [bad anchor](docs/A.md#nope) [web](https://example.com/x) see docs/E.md\n"
        "```\n[in code](docs/C.md)\n```\n`[inline](docs/D.md)`\n\n# Top\n")
    assert broken("README.md", root=str(tmp_path)) == ["docs/B.md: named, no such file",
                                                       "docs/E.md: named, no such file",
                                                       "docs/B.md: no such file",
                                                       "docs/A.md#nope: no heading with that anchor"]
