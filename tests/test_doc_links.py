"""The documents' links lead somewhere (the README's contents first): every `(#anchor)` to a heading
of the same file (GitHub's anchor rule), every relative link to a file or folder of the repository."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "mlxspec").rglob("*.md"))]  # the model cards, the loader's notes...
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """GitHub's: lower case, punctuation but hyphens dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _headings(text: str) -> set:
    out, fenced = set(), False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.+)", line)):
            out.add(_anchor(m.group(1)))
    return out


def test_links_lead_somewhere():
    broken, internal = [], 0
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        anchors = _headings(text)
        for target in LINK.findall(text):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            internal += 1
            file, _, anchor = target.partition("#")
            if (file and not (path.parent / file).exists()) or (not file and anchor not in anchors):
                broken.append(f"{path.relative_to(ROOT)}: {target}")
    assert not broken, f"links to nothing: {broken}"
    assert internal >= 12  # the README's contents at least: the check read the links it should


def test_the_anchor_rule_is_githubs():
    assert _anchor("Serve it (OpenAI-compatible API)") == "serve-it-openai-compatible-api"
    assert _anchor("NVIDIA GPUs (MLX's CUDA backend)") == "nvidia-gpus-mlxs-cuda-backend"
    assert _headings("# A\n```\n# not a heading\n```\n## B: c") == {"a", "b-c"}
